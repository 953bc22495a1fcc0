#!/usr/bin/env node
import "../dist/bundle/tapctl.js";
