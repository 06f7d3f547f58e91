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
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
    echo
    echo "scripts/test.sh: cargo test failed (exit $status); what failed, by test binary:"
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
    ' "$log"
fi
exit "$status"
