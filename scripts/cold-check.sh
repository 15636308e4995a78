#!/usr/bin/env bash
# The newcomer's run: the README's two commands the way someone who has never run Collimate runs
# them, timed step by step. A warm cache hides missing steps; this run has none of ours:
#   - a fresh clone of the commit under test (HEAD, or --ref REF): committed work only;
#   - an empty data directory (COLLIMATE_HOME, which holds its cache) for `npm start`, an empty
#     cache directory (COLLIMATE_CACHE_DIR) for `npm test`, and no node_modules;
#   - the machine's own npm configuration (~/.npmrc, e.g. nodedir=/usr): nothing npm_config_* is
#     set or cleared here, so a script that depends on it is caught.
# Debian packages are the machine's (set-up installs what is missing, and says how long it took).
#
#   bash scripts/cold-check.sh [--ref REF] [--start-only] [--keep] [--port N]
#
# 1. `npm start` until it serves (its set-up, then the server's first start), then until /healthz
#    shows no catalog template still building; then the server is stopped (SIGTERM).
# 2. `npm test` (CI=true, as .ci/run) with the empty cache: each of its stages timed.
# Prints a table of the steps and their seconds (also written to $COLD_CHECK_OUT, default
# /tmp/collimate-cold-check/summary-<time>.md); exits non-zero if a step failed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
ref=HEAD
start_only=no
keep=no
port=17070
while [ $# -gt 0 ]; do
  case "$1" in
    --ref) ref=${2:?--ref needs a commit}; shift 2 ;;
    --start-only) start_only=yes; shift ;;
    --keep) keep=yes; shift ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    *) echo "cold-check: unknown argument $1 (usage: cold-check.sh [--ref REF] [--start-only] [--keep] [--port N])" >&2; exit 2 ;;
  esac
done
commit=$(git -C "$repo" rev-parse --verify "$ref^{commit}")
[ -z "$(git -C "$repo" status --porcelain)" ] || echo "cold-check: the working tree has uncommitted changes; they are not in the clone (it checks $commit)" >&2

base=/tmp/collimate-cold-check
mkdir -p "$base"
# Short: VMM sockets live under the cache and the home, and a Unix socket path has 107 bytes at most.
run=$(mktemp -d /tmp/cc-XXXXXX)
clone="$run/clone"
# As a newcomer's: `npm start` keeps its cache in its home (no COLLIMATE_CACHE_DIR), and `npm test`
# its own in COLLIMATE_CACHE_DIR, so neither warms the other's.
unset COLLIMATE_CACHE_DIR COLLIMATE_HOME
home="$run/home"
cache="$run/cache"
out=${COLD_CHECK_OUT:-$base/summary-$(date -u +%Y%m%dT%H%M%SZ).md}
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if [ "$keep" = no ]; then
    # The RAM files of its templates and sandboxes sit on tmpfs, named after the directory (config.ts).
    for d in "$home" "$cache"; do rm -rf "/dev/shm/collimate-$(printf '%s' "$d" | sha256sum | cut -c1-12)"; done
    rm -rf "$run"
  else
    echo "cold-check: kept $run" >&2
  fi
}
trap cleanup EXIT

now() { date +%s%3N; }
secs() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }
rows=()
failed=no
row() { rows+=("| $1 | $2 | $3 |"); echo "cold-check: $1: $2 s ($3)" >&2; }

echo "cold-check: $commit in $run (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
t=$(now)
git clone -q "$repo" "$clone"
git -C "$clone" checkout -q "$commit"
row "fresh clone" "$(secs $(($(now) - t)))" "git clone"

# --- npm start ------------------------------------------------------------------------------------
cd "$clone"
log="$run/start.log"
t0=$(now)
# Each line stamped with the ms since npm start began, as it arrives.
( COLLIMATE_HOME="$home" npm start -- --port "$port" 2>&1 | while IFS= read -r line; do printf '%s %s\n' "$(($(date +%s%3N) - t0))" "$line"; done ) >"$log" &
server_pid=$!
serving_ms=
while kill -0 "$server_pid" 2>/dev/null; do
  if l=$(grep -m1 ' collimate serving ' "$log"); then serving_ms=${l%% *}; break; fi
  sleep 1
done
if [ -z "$serving_ms" ]; then
  tail -n 30 "$log" >&2
  echo "cold-check: npm start exited before serving (log above)" >&2
  exit 1
fi
setup_ms=$(grep -m1 -v ' collimate setup: \| > \|^[0-9]* $' "$log" | cut -d' ' -f1 || true)
row "npm start: set-up (Debian packages present, npm ci, console)" "$(secs "${setup_ms:-0}")" "$(grep -o 'collimate setup: [^(]*([0-9.]* s)' "$log" | sed 's/collimate setup: //' | paste -sd';' - | sed 's/;/; /g')"
row "npm start: to serving (total)" "$(secs "$serving_ms")" "$(grep -m1 -o 'collimate serving .*' "$log" | sed 's/^collimate serving //')"
# Then until the catalog templates built in the background are ready.
ready_ms=
deadline=$(($(now) + 1800000))
while [ "$(now)" -lt "$deadline" ] && kill -0 "$server_pid" 2>/dev/null; do
  if h=$(curl -fsS "http://127.0.0.1:$port/healthz" 2>/dev/null) && echo "$h" | node -e 'let s="";process.stdin.on("data",(c)=>s+=c).on("end",()=>{const c=JSON.parse(s).catalog;process.exit(c&&Object.keys(c.building).length===0&&Object.keys(c.failed).length===0?0:1)})'; then
    ready_ms=$(($(now) - t0)); break
  fi
  sleep 2
done
if [ -z "$ready_ms" ]; then
  failed=yes
  row "npm start: every catalog template ready" "-" "FAILED: $(curl -fsS "http://127.0.0.1:$port/healthz" 2>/dev/null | head -c 400 || echo 'server gone')"
else
  row "npm start: every catalog template ready" "$(secs "$ready_ms")" "$(grep -o '[a-z]*: ready ([0-9.]* s)' "$log" | paste -sd';' - | sed 's/;/; /g')"
fi
pkill -TERM -f "src/cli/main.ts serve --port $port" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
server_pid=
cp "$log" "$base/start-$(basename "$run").log"

# --- npm test -------------------------------------------------------------------------------------
if [ "$start_only" = no ]; then
  tlog="$run/test.log"
  t0=$(now)
  set +e
  CI=true COLLIMATE_CACHE_DIR="$cache" npm test 2>&1 | while IFS= read -r line; do printf '%s %s\n' "$(($(date +%s%3N) - t0))" "$line"; done >"$tlog"
  status=${PIPESTATUS[0]}
  set -e
  total=$(($(now) - t0))
  cp "$tlog" "$base/test-$(basename "$run").log"
  # The stages are the "== " lines scripts/test.sh and test-node.sh print.
  prev_ms=0
  prev_name="set-up"
  while IFS= read -r l; do
    ms=${l%% *}
    row "npm test: $prev_name" "$(secs $((ms - prev_ms)))" "stage"
    prev_ms=$ms
    prev_name=$(echo "${l#* }" | sed 's/^== //')
  done < <(grep -E '^[0-9]+ == ' "$tlog")
  row "npm test: $prev_name" "$(secs $((total - prev_ms)))" "stage"
  # node:test's closing counts (TAP's "# pass 613" on Node 20, the spec reporter's "ℹ pass 612" on 24).
  summary=$(grep -E '^[0-9]+ (ℹ|#) (tests|pass|fail|cancelled) [0-9]+$' "$tlog" | sed -E 's/^[0-9]+ (ℹ|#) //' | paste -sd' ' - || true)
  if [ "$status" -ne 0 ]; then
    failed=yes
    row "npm test (total)" "$(secs "$total")" "FAILED (exit $status); log: $base/test-$(basename "$run").log"
  else
    row "npm test (total)" "$(secs "$total")" "passed; node:test summaries in order: $summary"
  fi
fi

{
  echo "Cold check of $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), load average at the end $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
  echo
  echo "| step | seconds | notes |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out"
echo "cold-check: summary in $out" >&2
[ "$failed" = no ]
