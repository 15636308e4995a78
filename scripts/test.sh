#!/usr/bin/env bash
# The whole test suite: set-up, type check, unit tests (seconds, no QEMU), then integration tests on
# real microVMs. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export COLLIMATE_CACHE_DIR="${COLLIMATE_CACHE_DIR:-/var/tmp/collimate-test-cache}"
echo "== type check" >&2
node_modules/.bin/tsc -p tsconfig.json --noEmit
node_modules/.bin/tsc -p src/console/tsconfig.json --noEmit   # the web console: browser code, its own settings
echo "== unit tests" >&2
# Node 20's --test does not expand globs itself.
mapfile -t unit < <(find test/unit -name '*.test.ts' | sort)
node --import tsx --test --test-concurrency=4 "${unit[@]}"
echo "== guest assets and catalog templates (cached in $COLLIMATE_CACHE_DIR)" >&2
node --import tsx scripts/prepare.ts
echo "== integration tests (real microVMs)" >&2
# The suite oversubscribes two cores on purpose (busy-loop guests, restore stress, two files at a
# time), so admission by CPU pressure would refuse creates at random; admission.test.ts turns it on
# where it is what is tested. Memory admission stays on everywhere.
export COLLIMATE_HOST_CPU_PRESSURE_MAX="${COLLIMATE_HOST_CPU_PRESSURE_MAX:-0}"
# scripts/run-tests.ts runs them as `node --test` would, but in the order given (Node 20's --test
# sorts its files by name), and ends with each file's wall time.
mapfile -t integration < <(find test/integration -name '*.test.ts' | sort)
node --import tsx scripts/run-tests.ts --concurrency="${COLLIMATE_TEST_CONCURRENCY:-2}" --timeout=900000 "${integration[@]}"
# The machine's Node.js ran all of the above; the current LTS runs the type check, the unit tests and
# a real-VM smoke test too (its build from the npm registry and a better-sqlite3 built for it are
# cached: about a minute and a half warm, three cold). COLLIMATE_TEST_NODE_MAJORS="" skips it.
for major in ${COLLIMATE_TEST_NODE_MAJORS-24}; do
  echo "== Node.js $major (scripts/test-node.sh)" >&2
  bash scripts/test-node.sh "$major"
done
