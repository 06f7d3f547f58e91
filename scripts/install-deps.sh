#!/usr/bin/env bash
# Installs with apt-get what the tests and the `--all-features` build need,
# when it is missing: the servers the integration tests start (redis-server,
# PostgreSQL and PgBouncer, MariaDB, etcd, ZooKeeper), OpenSSL for the TLS test, and protoc with its
# well-known protos for the etcd client's build. Run by scripts/test.sh and
# by CI before its first build.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
# The TLS test: a client built on OpenSSL, and the CLI that makes the
# server's certificate.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev pkg-config)
# The etcd store: the server, and protoc with its well-known protos, which
# the etcd client's build compiles.
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
# PgBouncer, for the PostgreSQL store behind a pooler.
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
# MariaDB, for the MySQL store: the server and the client it installs its
# data directory with (the -core packages only: no Galera, no init scripts).
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server-core)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client-core)
# ZooKeeper (apt brings the Java runtime it needs).
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || missing+=(zookeeper)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} with apt-get" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "using $(redis-server --version)" >&2
echo "using $(ls -d /usr/lib/postgresql/*/bin | tail -n 1)" >&2
echo "using etcd $(etcd --version | head -n 1)" >&2
echo "using $(/usr/sbin/mariadbd --version 2>/dev/null || mariadbd --version)" >&2
echo "using ZooKeeper $(dpkg-query -W -f '${Version}' zookeeper 2>/dev/null || echo '(not from apt)')" >&2

