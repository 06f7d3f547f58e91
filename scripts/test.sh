#!/usr/bin/env bash
# Runs every test of the workspace: unit, UI (trybuild), integration and doc
# tests. Installs the servers the integration tests start (redis-server,
# PostgreSQL, MariaDB, etcd, ZooKeeper), OpenSSL and protoc with apt-get when they are missing
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
# Every test binary runs even when one fails (--no-fail-fast), so one
# failure does not hide the rest; what failed is summed up at the end.
summarize() { # the log of one cargo test
    awk '
        /^ *Running / { binary = $2 }
        /^ *Doc-tests / { binary = "doc tests of " $2 }
        /^test .* \.\.\. FAILED$/ { sub(/^test /, ""); sub(/ \.\.\. FAILED$/, ""); print "  " binary ": " $0; n++ }
        /^error: (could not compile|test failed|[0-9]+ targets? failed)/ { errors = errors "  " $0 "\n" }
        /^ +`-p / { errors = errors "  " $0 "\n" }
        # Each failed test'"'"'s panic message (its first 25 lines), so the
        # cause is at the end of the output, however long the rest is.
        /^---- .* stdout ----$/ { test = $2; taking = 0 }
        /^thread .* panicked at / && test != "" {
            why = why "\n  " test " panicked at " $NF "\n"; taking = 25; test = ""; next
        }
        taking > 0 {
            if ($0 ~ /^note: run with `RUST_BACKTRACE/ || $0 ~ /^stack backtrace:/) { taking = 0; next }
            why = why "    " $0 "\n"; taking--
        }
        END {
            if (n == 0) print "  (no single test reported FAILED: a build error, a crash or a time-out; see above)"
            printf "%s", errors
            if (why != "") printf "\nwhy, as each failed test said it:%s", why
        }
    ' "$1"
}
test_all=(cargo test --workspace --all-features --no-fail-fast)
logs=()
trap 'rm -f "${logs[@]}"' EXIT
statuses=()
status=0
if [ "$#" -gt 0 ]; then
    # Arguments select what runs: one cargo test gets them.
    logs+=("$(mktemp)")
    "${test_all[@]}" "$@" 2>&1 | tee "${logs[0]}" || statuses[0]=$?
else
    # Most test binaries wait on their servers, not the CPU: after one
    # build they run in two lanes at once, which takes about half as long.
    # The first lane is the slowest store suites; the second everything
    # else the plain command runs (every other test target, unit tests,
    # examples marked `test`, doc tests), listed from the manifests so that
    # a new test target is never left out.
    cargo test --workspace --all-features --no-run
    first=(postgres redis etcd examples)
    mapfile -t second < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
first = set(sys.argv[1:])
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        if target["kind"] == ["test"] and target["name"] not in first:
            print("--test", target["name"], sep="\n")
        elif target["kind"] == ["example"] and target.get("test"):
            print("--example", target["name"], sep="\n")
' "${first[@]}")
    [ "${#second[@]}" -gt 0 ] || { echo "scripts/test.sh: no test targets listed" >&2; exit 1; }
    logs+=("$(mktemp)" "$(mktemp)")
    # The first lane's output streams; the second's follows when both end.
    ( "${test_all[@]}" "${first[@]/#/--test=}" 2>&1 | tee "${logs[0]}" ) &
    lane_one=$!
    (
        "${test_all[@]}" --lib --bins "${second[@]}" && lib_status=0 || lib_status=$?
        "${test_all[@]}" --doc && exit "$lib_status"
    ) >"${logs[1]}" 2>&1 &
    lane_two=$!
    wait "$lane_one" || statuses[0]=$?
    wait "$lane_two" || statuses[1]=$?
    cat "${logs[1]}"
fi
for i in "${!logs[@]}"; do
    [ "${statuses[$i]:-0}" -eq 0 ] && continue
    [ "$status" -ne 0 ] || status=${statuses[$i]}
    echo
    echo "scripts/test.sh: cargo test failed (exit ${statuses[$i]}); what failed, by test binary:"
    summarize "${logs[$i]}"
done
exit "$status"
