#!/usr/bin/env bash
# The whole test suite: set-up, type check, unit tests (seconds, no QEMU), then integration tests on
# real microVMs. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
export COLLIMATE_CACHE_DIR="${COLLIMATE_CACHE_DIR:-/var/tmp/collimate-test-cache}"
bash scripts/setup.sh
# Built beside the type check and the unit tests, which need neither: the guest assets and catalog
# templates (from an empty cache, minutes of downloads, apt in chroots and bakes) and each other
# Node.js the end runs on (a download and a native build). Each one's output is printed when it is
# waited for. One still running when this script ends early (a failed step) is waited for, not
# killed: a layer build cut off mid-apt would leave its chroot's mounts (/proc, /sys, /dev bound in)
# behind. In a session of its own (setsid), a Ctrl-C at the terminal does not reach it either.
bg=$(mktemp -d /tmp/collimate-test-bg-XXXXXX)
declare -A bg_pid=()
finish_background() {
  for name in "${!bg_pid[@]}"; do
    echo "test.sh: waiting for $name to finish before exiting (log: $bg/$name.log is removed after)" >&2
    wait "${bg_pid[$name]}" 2>/dev/null || true
  done
  rm -rf "$bg"
}
trap finish_background EXIT
start_background() { local name=$1; shift; setsid "$@" >"$bg/$name.log" 2>&1 & bg_pid[$name]=$!; }
wait_background() {
  local name=$1 status=0
  wait "${bg_pid[$name]}" || status=$?
  unset "bg_pid[$name]"
  cat "$bg/$name.log" >&2
  [ "$status" -eq 0 ] || { echo "test.sh: $name failed (exit $status)" >&2; exit "$status"; }
}
start_background prepare node --import tsx scripts/prepare.ts
for major in ${COLLIMATE_TEST_NODE_MAJORS-24}; do
  start_background "node$major" env COLLIMATE_NODE_STEPS= bash scripts/test-node.sh "$major"
done
echo "== type check" >&2
node_modules/.bin/tsc -p tsconfig.json --noEmit
node_modules/.bin/tsc -p src/console/tsconfig.json --noEmit   # the web console: browser code, its own settings
echo "== unit tests" >&2
# Node 20's --test does not expand globs itself.
mapfile -t unit < <(find test/unit -name '*.test.ts' | sort)
node --import tsx --test --test-concurrency=4 "${unit[@]}"
# The other Node.js's type check and unit tests need no VM either: they run while the guest assets
# may still be building (from an empty cache, minutes after the unit tests end); its smoke test on
# real VMs runs at the end.
for major in ${COLLIMATE_TEST_NODE_MAJORS-24}; do
  echo "== Node.js $major: type check and unit tests (scripts/test-node.sh; fetched and built since the set-up)" >&2
  wait_background "node$major"
  COLLIMATE_NODE_STEPS="typecheck unit" bash scripts/test-node.sh "$major"
done
echo "== guest assets and catalog templates (cached in $COLLIMATE_CACHE_DIR; built since the set-up)" >&2
wait_background prepare
echo "== integration tests (real microVMs)" >&2
# The suite oversubscribes two cores on purpose (busy-loop guests, restore stress, two files at a
# time), so admission by CPU pressure would refuse creates at random; admission.test.ts turns it on
# where it is what is tested. Memory admission stays on everywhere.
export COLLIMATE_HOST_CPU_PRESSURE_MAX="${COLLIMATE_HOST_CPU_PRESSURE_MAX:-0}"
# Longest first: two at a time in name order, a long file that sorted late (soak) ran on while the
# other core idled. The order is the wall times a full run measured (scripts/run-tests.ts prints them
# at its end; update this list from there). A file not named here runs first, in name order, since
# its length is unknown; a name here with no file is reported and skipped.
longest_first=(
  cluster chaos lifecycle restore fuzz code isolation files soak console sdk slowReaders doorFuzz clusterSnapshots pools api
  snapshots network images seed e2b contract admission processes packages idlePause engine catalog
  firstStart images-debian users service ports smoke portableArtifacts
)
mapfile -t found < <(find test/integration -name '*.test.ts' | sort)
integration=()
for f in "${found[@]}"; do
  [[ " ${longest_first[*]} " == *" $(basename "$f" .test.ts) "* ]] || integration+=("$f")
done
for name in "${longest_first[@]}"; do
  f="test/integration/$name.test.ts"
  if [ -f "$f" ]; then integration+=("$f"); else echo "test.sh: $f is in longest_first but not there" >&2; fi
done
# scripts/run-tests.ts runs them as `node --test` would, but in the order given (Node 20's --test
# sorts its files by name), and ends with each file's wall time.
# The time limit is per file: cluster.test.ts, the longest, took up to 900 s on a loaded 2-core host.
node --import tsx scripts/run-tests.ts --concurrency="${COLLIMATE_TEST_CONCURRENCY:-2}" --timeout=1500000 "${integration[@]}"
# The machine's Node.js ran all of the above; the current LTS ran the type check and the unit tests
# above, and runs a real-VM smoke test here (its build from the npm registry and a better-sqlite3
# built for it are cached; a cold fetch and build run beside the unit tests).
# COLLIMATE_TEST_NODE_MAJORS="" skips it.
for major in ${COLLIMATE_TEST_NODE_MAJORS-24}; do
  echo "== Node.js $major: smoke test on real microVMs (scripts/test-node.sh)" >&2
  COLLIMATE_NODE_STEPS=smoke bash scripts/test-node.sh "$major"
done
