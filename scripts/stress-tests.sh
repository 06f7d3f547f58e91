#!/usr/bin/env bash
# Runs the README's test command (scripts/test.sh) N times in a clean clone
# of this repository's HEAD while a CPU-bound job runs beside it, and prints
# the failures per test. For proving the suite on a busy machine:
#
#   scripts/stress-tests.sh 5            # a busy loop on one core beside it
#   STRESS_LOAD=build scripts/stress-tests.sh 5   # a cargo build, over and over
#   STRESS_LOAD=none scripts/stress-tests.sh 1    # no load
#
# The clone is built once, by the first run; each run's output is kept in
# the clone's stress/ folder. Exits non-zero if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
load=${STRESS_LOAD:-spin}
clone=$(mktemp -d /tmp/lock-stress.XXXXXX)
git clone -q . "$clone"
mkdir -p "$clone/stress"
echo "stress: $runs runs of scripts/test.sh in $clone (HEAD $(git rev-parse --short HEAD)), load: $load" >&2

load_pid=""
run_pid=""
stop_load() {
    if [ -n "$load_pid" ]; then
        # The load runs in a process group of its own: end all of it.
        kill -- "-$load_pid" 2>/dev/null || true
        wait "$load_pid" 2>/dev/null || true
        load_pid=""
    fi
}
# Stopped early (Ctrl-C, kill): the run in progress ends too, with every
# server its tests started (they are in its process group).
stop_all() {
    if [ -n "$run_pid" ]; then
        kill -9 -- "-$run_pid" 2>/dev/null || true
    fi
    stop_load
}
trap stop_all EXIT
trap 'exit 130' INT TERM

case "$load" in
    spin)
        # One core busy at normal priority.
        setsid bash -c 'while :; do :; done' &
        load_pid=$!
        ;;
    build)
        # A cargo build of this workspace's benchmark, from scratch, again
        # and again, in a target folder of its own.
        setsid bash -c "
            while :; do
                cargo build -q --release --manifest-path '$clone/bench/Cargo.toml' \
                    --target-dir '$clone/stress/load-target' >/dev/null 2>&1
                rm -rf '$clone/stress/load-target'
            done" &
        load_pid=$!
        ;;
    none) ;;
    *)
        echo "stress: unknown STRESS_LOAD=$load; expected spin, build or none" >&2
        exit 2
        ;;
esac

failed_runs=0
for run in $(seq 1 "$runs"); do
    log="$clone/stress/run-$run.log"
    started=$(date +%s)
    # In a process group of its own, so that stopping the script stops it.
    (cd "$clone" && exec setsid ./scripts/test.sh >"$log" 2>&1) &
    run_pid=$!
    if wait "$run_pid"; then
        outcome=passed
    else
        outcome=FAILED
        failed_runs=$((failed_runs + 1))
    fi
    run_pid=""
    # What the run counted: the sum of cargo test's result lines.
    counts=$(awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d ignored", p, f, i }' "$log")
    echo "stress: run $run/$runs $outcome in $(($(date +%s) - started)) s ($counts); log $log" >&2
    grep -E '^test .* \.\.\. FAILED$' "$log" | sed 's/^/stress:   /' >&2 || true
done
stop_load

echo "stress: failures per test over $runs runs (load: $load):" >&2
failures=$(cat "$clone"/stress/run-*.log | grep -E '^test .* \.\.\. FAILED$' | sed -e 's/^test //' -e 's/ \.\.\. FAILED$//' | sort | uniq -c | sort -rn || true)
if [ -z "$failures" ]; then
    echo "stress:   none" >&2
else
    echo "$failures" | sed 's/^/stress: /' >&2
fi
echo "stress: $((runs - failed_runs)) of $runs runs passed" >&2
[ "$failed_runs" -eq 0 ]
