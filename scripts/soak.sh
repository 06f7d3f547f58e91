#!/usr/bin/env bash
# A soak of one store, as long as asked: worker processes lock a few keys
# at random (wait and skip mode, several keys at once, semaphores and
# read-write locks, callers giving up) while some are SIGKILLed, frozen or
# cut off past their leases and the store has faults of its own; every
# body is then checked (no two of a key at once but as the store
# documents, fencing tokens rising, keys free in time, no unlisted error).
# CI runs each for 15-25 s; this runs them longer, or replays one.
#
#   scripts/soak.sh STORE [--minutes M] [--seed S]
#
# STORE: memory, redis, cluster (Redis Cluster), sentinel (Redis with
# Sentinel), redlock, postgres, mysql, etcd or zookeeper. The servers start on
# loopback ports of their own and are stopped by pid at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/soak.sh memory|redis|cluster|sentinel|redlock|postgres|mysql|etcd|zookeeper [--minutes M] [--seed S]"
store="${1:-}"
shift || true
case "$store" in
  memory) suite=memory; filter=soak:: ;;
  redis) suite=redis; filter=soak::one_server ;;
  cluster) suite=redis; filter=soak::a_cluster ;;
  redlock) suite=redis; filter=soak::redlock ;;
  sentinel) suite=redis_sentinel; filter=the_master_failed_over ;;
  postgres | mysql | etcd | zookeeper) suite="$store"; filter=soak:: ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
minutes=1
seed=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
export SOAK_SECONDS=$((minutes * 60))
if [ -n "$seed" ]; then export SOAK_SEED="$seed"; fi
# The same build as the test command's (no second, release build).
exec cargo test -p lock-tests --test "$suite" -- "$filter" --nocapture --test-threads 1
