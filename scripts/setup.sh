#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine, run as root: installs every Debian package and npm
# dependency Collimate needs. `collimate serve` and the test suite both call it; the second run is a
# no-op that takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step that does something says how long it took.
setup_t0=$(date +%s%3N)
step_t0=$setup_t0
# Seconds since $1 (ms since the epoch), to a tenth: "12.3".
secs_since() {
  local ms=$(($(date +%s%3N) - $1))
  printf '%d.%01d' $((ms / 1000)) $(((ms % 1000) / 100))
}
step_done() {
  echo "collimate setup: $1 ($(secs_since "$step_t0") s)" >&2
  step_t0=$(date +%s%3N)
}

DEBIAN_PACKAGES=(
  qemu-system-x86 qemu-utils        # the VMM (microvm machine) and qemu-img for qcow2 overlays
  kmod                              # depmod/modprobe to order the guest kernel modules
  busybox-static                    # the base template's userland
  musl-tools gcc make libc6-dev     # the static guest agent
  g++ python3                       # node-gyp: better-sqlite3 from source where no prebuilt binary is reachable (scripts/test-node.sh)
  erofs-utils squashfs-tools        # read-only layer images
  zstd attr                         # own images: zstd layers (Node 20's zlib has no zstd), setfattr for opaque dirs and capabilities
  docker-registry apache2-utils     # the image tests' local OCI registry, and htpasswd -B for its basic auth
  e2fsprogs                         # the writable ext4 layer
  cpio                              # the initramfs
  debootstrap                       # the Debian base layer of the python, node and debian templates
  iproute2 procps util-linux        # ip (network namespaces, veth, tap), ps, nsenter
  nftables                          # the egress policy in each sandbox's namespace (src/net/nft.ts)
  python3-venv python3-pip python3-setuptools python3-wheel  # the SDK tests build the Python SDK's wheel offline and install it into a fresh venv
  ca-certificates
  chromium                          # the web console's browser tests drive it headless (playwright-core, never a downloaded browser)
  postgresql                        # cluster mode's shared catalog; its tests run a throwaway server of their own (test/support/postgres.ts)
)

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "collimate setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Installing postgresql makes and starts the distribution's own cluster (15/main). Collimate never
  # uses it (tests run their own, cluster hosts are pointed at one with --cluster), so it is stopped
  # again unless it was already running.
  pg_was_running=no
  if command -v pg_lsclusters >/dev/null 2>&1 && pg_lsclusters --no-header 2>/dev/null | awk '$4 == "online"' | grep -q .; then pg_was_running=yes; fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$pg_was_running" = no ] && command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | awk '$4 == "online" { print $1, $2 }' | while read -r ver name; do
      pg_ctlcluster "$ver" "$name" stop || true
    done
  fi
  step_done "Debian packages installed"
fi
# The guest kernel is fetched with `apt-get download`, which needs package lists.
if ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then
  apt-get update -qq
  step_done "package lists updated"
fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "collimate setup: installing npm dependencies" >&2
  # Install scripts run after, one package at a time: better-sqlite3's is a native build from source
  # (about a minute: its prebuilt binaries are on GitHub, which these machines cannot reach), and a
  # build this machine made before is taken from the cache instead when it loads.
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
  mapfile -t scripted < <(node -e 'const l = require("./package-lock.json"); for (const [k, v] of Object.entries(l.packages)) if (v.hasInstallScript && k !== "node_modules/better-sqlite3") console.log(k.replace(/^.*node_modules\//, ""))')
  [ "${#scripted[@]}" -eq 0 ] || npm rebuild --loglevel=error "${scripted[@]}" >/dev/null
  step_done "npm dependencies installed"
  # Keyed by the package's version and this Node.js's ABI and architecture; used only if it loads.
  native_cache="${COLLIMATE_CACHE_DIR:-${COLLIMATE_HOME:-$HOME/.collimate}}/native"
  binding=node_modules/better-sqlite3/build/Release/better_sqlite3.node
  cached="$native_cache/better-sqlite3-$(node -p 'require("./node_modules/better-sqlite3/package.json").version')-abi$(node -p 'process.versions.modules + "-" + process.arch')/better_sqlite3.node"
  sqlite_loads() { node -e 'const D = require("better-sqlite3"); const db = new D(":memory:"); if (db.prepare("select 41 + 1 as n").get().n !== 42) process.exit(1)' 2>/dev/null; }
  if [ -f "$cached" ] && mkdir -p "$(dirname "$binding")" && cp "$cached" "$binding" && sqlite_loads; then
    step_done "better-sqlite3: the build cached in $(dirname "$cached")"
  else
    rm -rf node_modules/better-sqlite3/build
    npm rebuild --loglevel=error better-sqlite3 >/dev/null
    sqlite_loads || { echo "collimate setup: better-sqlite3 was built but does not load under $(node --version)" >&2; exit 1; }
    mkdir -p "$(dirname "$cached")" && cp "$binding" "$cached.tmp" && mv "$cached.tmp" "$cached"
    step_done "better-sqlite3 built from source (cached in $(dirname "$cached"))"
  fi
fi

# The web console's bundle (dist/console, served at /console): rebuilt only when its sources changed.
node --import tsx scripts/build-console.ts
if [ $(($(date +%s%3N) - setup_t0)) -ge 5000 ]; then
  echo "collimate setup: done in $(secs_since "$setup_t0") s" >&2
fi
