#!/usr/bin/env bash
# Runs every test of the workspace: unit, UI (trybuild), integration and doc
# tests. Installs the servers the integration tests start (redis-server,
# PostgreSQL, etcd), OpenSSL and protoc with apt-get when they are missing
# (scripts/install-deps.sh): the tests run their own servers on free
# loopback ports in temporary directories.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

# Warnings are errors here, as in CI (which sets the same flag for every step).
case " ${RUSTFLAGS:-} " in
    *" -D warnings "*) ;;
    *) export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-D warnings" ;;
esac
exec cargo test --workspace --all-features "$@"
