#!/usr/bin/env node
import "../dist/bundle/vmwrapper.js";
