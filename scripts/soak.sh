#!/usr/bin/env bash
# A soak of one store, as long as asked: worker processes lock a few keys
# at random while some are SIGKILLed and others frozen past their leases;
# every body is then checked (no two of a key at once, fencing tokens
# rising). CI runs each for 20-25 s; this runs them longer, or replays one.
#
#   scripts/soak.sh STORE [--minutes M] [--seed S]
#
# STORE: redis, postgres, etcd or zookeeper. The servers start on loopback
# ports of their own and are stopped by pid at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

store="${1:-}"
shift || true
case "$store" in
  redis | postgres | etcd | zookeeper) ;;
  *)
    echo "usage: scripts/soak.sh redis|postgres|etcd|zookeeper [--minutes M] [--seed S]" >&2
    exit 2
    ;;
esac
minutes=1
seed=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
export SOAK_SECONDS=$((minutes * 60))
if [ -n "$seed" ]; then export SOAK_SEED="$seed"; fi
# The same build as the test command's (no second, release build).
exec cargo test -p lock-tests --test "$store" -- soak:: --nocapture --test-threads 1
