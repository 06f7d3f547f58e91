#!/usr/bin/env bash
# Runs every test of the workspace: unit, UI (trybuild), integration and doc
# tests. Installs the servers the integration tests start (redis-server,
# PostgreSQL) and OpenSSL with apt-get when they are missing: the tests run
# their own servers on free loopback ports in temporary directories.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
# The TLS test: a client built on OpenSSL, and the CLI that makes the
# server's certificate.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev pkg-config)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} with apt-get" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "using $(redis-server --version)" >&2
echo "using $(ls -d /usr/lib/postgresql/*/bin | tail -n 1)" >&2

# Warnings are errors here, as in CI (which sets the same flag for every step).
case " ${RUSTFLAGS:-} " in
    *" -D warnings "*) ;;
    *) export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-D warnings" ;;
esac
exec cargo test --workspace --all-features "$@"
