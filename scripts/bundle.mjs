// Bundles each entry point into dist/bundle/. vmwrapper runs at every VM start and every libvirt probe: one
// CommonJS file (no ESM loader, no module resolution at start-up; bundling cuts start-up
// from ~190 ms to ~110 ms), dist/bundle/vmwrapper.cjs; its start path is loaded lazily inside it (esbuild wraps
// modules reached only by import() in init functions that run on demand). tapmanager and tapctl: ESM bundles.
import { build } from 'esbuild';

// Loaded with import() only on the paths that use them (kubelet's PodResources API, YAML CDI specs): kept out of
// the bundles and resolved from node_modules at run time, so a VM start that does not take those paths neither
// reads nor parses them.
const external = ['@grpc/grpc-js', '@grpc/proto-loader', 'yaml'];
const common = { bundle: true, platform: 'node', target: 'node20', sourcemap: true, logLevel: 'warning', external };
await Promise.all([
  ...['tapmanager', 'tapctl'].map((name) =>
    build({
      ...common,
      entryPoints: [`src/bin/${name}.ts`],
      outfile: `dist/bundle/${name}.js`,
      format: 'esm',
      // CommonJS dependencies (pino) call require(): give the ESM bundle one
      banner: { js: "import { createRequire as __vmpodCreateRequire } from 'node:module'; const require = __vmpodCreateRequire(import.meta.url);" },
    }),
  ),
  build({
    ...common,
    entryPoints: ['src/bin/vmwrapper.ts'],
    outfile: 'dist/bundle/vmwrapper.cjs',
    format: 'cjs',
    // the sources are ESM: native.ts finds the addon from import.meta.url
    define: { 'import.meta.url': '__vmpodImportMetaUrl' },
    banner: { js: "const __vmpodImportMetaUrl = require('node:url').pathToFileURL(__filename).href;" },
  }),
]);
