#!/usr/bin/env node
// CommonJS (bin/package.json), so no ESM loader starts: vmwrapper runs on every VM start and libvirt probe
require("../dist/bundle/vmwrapper.cjs");
