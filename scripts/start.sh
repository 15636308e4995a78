#!/usr/bin/env bash
# `npm start`: the set-up (scripts/setup.sh), then the server with its embedded defaults. Every step
# says how long it took, and the server's "serving" line the total since this script began
# (COLLIMATE_STARTED_AT_MS). Arguments go to `collimate serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
COLLIMATE_STARTED_AT_MS=$(date +%s%3N)
export COLLIMATE_STARTED_AT_MS
bash scripts/setup.sh
exec node --import tsx src/cli/main.ts serve "$@"
