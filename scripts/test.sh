#!/usr/bin/env bash
# The test command: installs what the tests need, builds, runs every test (unit, integration against the real
# kernel and CNI plugins, e2e with qemu and libvirt), and ends with one line "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the tests, and every node they spawn by name, run on the project's Node 24 (scripts/node.sh)
source scripts/node.sh
echo "test.sh: node $(node --version) ($(command -v node))"
# sources and tests type-check together (the build checks src/ alone)
if ! npm run typecheck --silent; then
  echo "0 passed, 1 failed"
  exit 1
fi
# one formatter and linter (Biome), src/ within 120 columns and its functions within 80 lines, no unused files,
# exports or dependencies (knip)
if ! npm run lint --silent; then
  echo "0 passed, 1 failed"
  exit 1
fi
mkdir -p .cache
report=.cache/vitest-report.json
rm -f "$report"
# temp dirs and named netns there before the run: any other one there after it is a leak, counted as a failure
node scripts/leftovers.mjs snapshot .cache/leftovers-before.json
status=0
npx vitest run --reporter=default --reporter=json --outputFile.json="$report" "$@" || status=$?
leaks=0
node scripts/leftovers.mjs check .cache/leftovers-before.json || leaks=1
[ "$leaks" -eq 0 ] || status=1
if [ -f "$report" ]; then
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const failedFiles = r.testResults.filter((f) => f.status === "failed" && f.assertionResults.length === 0).length;
    console.log(`${r.numPassedTests} passed, ${r.numFailedTests + failedFiles + Number(process.argv[2])} failed`);
  ' "$report" "$leaks"
else
  echo "0 passed, 1 failed"
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"
