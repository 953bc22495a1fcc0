// Bundles each entry point into dist/bundle/. vmwrapper runs at every VM start and every libvirt probe: CommonJS
// (no ESM loader, no module resolution at start-up: docs/performance.md), in two files:
// dist/bundle/vmwrapper.cjs, the entry and the probe path, and dist/bundle/vmwrapper-start.cjs, the start path
// (src/vmwrapper/run.ts: the client, the qemu argv builder, the device scan), which the entry require()s only on a
// start, so a probe neither reads nor parses it. vmwrapper.cjs is executable (a shebang): libvirt runs it as it is.
// tapmanager, tapctl and vfio-device-plugin: ESM bundles, run by their launchers in bin/.
import { build } from 'esbuild';

// Loaded with import() only on the paths that use them (kubelet's PodResources API, YAML CDI specs): kept out of
// the bundles and resolved from node_modules at run time, so a VM start that does not take those paths neither
// reads nor parses them.
const external = ['@grpc/grpc-js', '@grpc/proto-loader', 'yaml'];
// vmwrapper.cjs's interpreter: the node that builds it, by absolute path (the image's build and runtime stages both
// have it at /usr/local/bin/node); `#!/usr/bin/env node` would cost every start and probe an exec of env and its
// PATH search. A path a shebang cannot carry (whitespace, too long) falls back to env.
const SHEBANG_NODE = /^\/\S{1,200}$/.test(process.execPath) ? process.execPath : '/usr/bin/env node';
const common = { bundle: true, platform: 'node', target: 'node24', sourcemap: true, logLevel: 'warning', external };
/**
 * A CommonJS module's wrapper, as node:module's wrap() puts it around a file's source (the loader does it by hand:
 * loading node:module cost every start measurably); the code cache below is made of the same string.
 */
const WRAP = ['(function (exports, require, module, __filename, __dirname) { ', '\n});'];

/**
 * In vmwrapper's entry bundle, src/vmwrapper/run.ts is the other bundle: `import('../vmwrapper/run.js')` becomes
 * START_LOADER, which compiles vmwrapper-start.cjs with the V8 code cache made at build time (below), as require()
 * would run it. A cache V8 rejects (another Node, other flags) or a missing one only costs the compile it would save.
 */
const START_LOADER = `
const { readFileSync } = require('node:fs');
const { join } = require('node:path');
const { Script } = require('node:vm');
const file = join(__dirname, 'vmwrapper-start.cjs');
let cachedData;
try {
  cachedData = readFileSync(file + '.cache');
} catch {}
const fn = new Script(${JSON.stringify(WRAP[0])} + readFileSync(file, 'utf8') + ${JSON.stringify(WRAP[1])}, { filename: file, ...(cachedData ? { cachedData } : {}) }).runInThisContext();
const m = { exports: {} };
// the entry's require: the same dir as the start bundle, so the same resolution as a require() of it
fn.call(m.exports, m.exports, require, m, file, __dirname);
module.exports = m.exports;
`;
const startPathApart = {
  name: 'vmwrapper-start-apart',
  setup(b) {
    b.onResolve({ filter: /\/vmwrapper\/run\.js$/ }, (a) =>
      a.importer.endsWith('src/bin/vmwrapper.ts') ? { path: 'vmwrapper-start-loader', namespace: 'vmpod' } : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'vmpod' }, () => ({ contents: START_LOADER, loader: 'js' }));
  },
};
await Promise.all([
  ...['tapmanager', 'tapctl', 'vfio-device-plugin'].map((name) =>
    build({
      ...common,
      entryPoints: [`src/bin/${name}.ts`],
      outfile: `dist/bundle/${name}.js`,
      format: 'esm',
      // CommonJS dependencies (pino) call require(): give the ESM bundle one
      banner: {
        js: "import { createRequire as __vmpodCreateRequire } from 'node:module'; const require = __vmpodCreateRequire(import.meta.url);",
      },
    }),
  ),
  ...[
    ['src/bin/vmwrapper.ts', 'vmwrapper.cjs'],
    ['src/vmwrapper/run.ts', 'vmwrapper-start.cjs'],
  ].map(([entry, out]) =>
    build({
      ...common,
      entryPoints: [entry],
      outfile: `dist/bundle/${out}`,
      format: 'cjs',
      // import() of the start path becomes a require() of its bundle (no ESM loader)
      supported: { 'dynamic-import': false },
      plugins: [startPathApart],
      // the sources are ESM: import.meta.url becomes a file: URL of the bundle, made when first read (pathToFileURL's
      // first call is not free; native.ts takes __dirname instead, and a start reads none)
      define: { 'import.meta.url': '__vmpodMeta.url' },
      // vmwrapper.cjs is the program itself (libvirt's <emulator> links to it): its own shebang, no launcher file
      // in between (a launcher's require() of the bundle would cost every start)
      banner: {
        js: `${out === 'vmwrapper.cjs' ? `#!${SHEBANG_NODE}\n` : ''}const __vmpodMeta = { get url() { return require('node:url').pathToFileURL(__filename).href; } };`,
      },
    }),
  ),
]);
(await import('node:fs')).chmodSync(new URL('../dist/bundle/vmwrapper.cjs', import.meta.url), 0o755);

// The code cache of the start path: every function of vmwrapper-start.cjs compiled eagerly (V8's --no-lazy for this
// one compile, then back, so the cache's flag hash is a plain start's), written beside it; START_LOADER hands it to V8.
// A lazy cache (the top level only) left each function a start calls to be compiled on its first call.
// Made by the Node that builds; checked here the way a start will read it.
{
  const { readFileSync, writeFileSync } = await import('node:fs');
  const { Script } = await import('node:vm');
  const v8 = (await import('node:v8')).default;
  const file = new URL('../dist/bundle/vmwrapper-start.cjs', import.meta.url).pathname;
  const source = WRAP[0] + readFileSync(file, 'utf8') + WRAP[1];
  v8.setFlagsFromString('--no-lazy');
  const script = new Script(source, { filename: file });
  v8.setFlagsFromString('--lazy');
  const cachedData = script.createCachedData();
  writeFileSync(`${file}.cache`, cachedData);
  if (new Script(source, { filename: file, cachedData }).cachedDataRejected)
    console.warn(`bundle: V8 rejects the code cache of ${file}: a start compiles it instead`);
}
