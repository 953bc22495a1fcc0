#!/usr/bin/env node
import "../dist/bundle/tapmanager.js";
