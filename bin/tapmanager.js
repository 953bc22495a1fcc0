#!/usr/bin/env node
// CommonJS (bin/package.json): the ESM bundle is imported
import('../dist/bundle/tapmanager.js');
