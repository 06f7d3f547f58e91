#!/usr/bin/env bash
# Runs every test of the workspace: unit, UI (trybuild), integration and doc
# tests. Installs redis-server first when it is missing: the integration
# tests start their own redis-server processes on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing it with apt-get" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
echo "using $(redis-server --version)" >&2

# Warnings are errors here, as in CI (which sets the same flag for every step).
case " ${RUSTFLAGS:-} " in
    *" -D warnings "*) ;;
    *) export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-D warnings" ;;
esac
exec cargo test --workspace --all-features "$@"
