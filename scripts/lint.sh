#!/usr/bin/env bash
# The checks beside the tests: clippy with warnings denied on the workspace
# (all targets, all features) and on the benchmark, the docs with warnings
# denied, the module layering, and the published crates packaged and built
# as crates.io would get them. `.ci/run` runs it before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

case " ${RUSTFLAGS:-} " in
    *" -D warnings "*) ;;
    *) export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-D warnings" ;;
esac

python3 scripts/module-graph.py lock-runtime lock-macros
# Also the MSRV check: clippy's incompatible_msrv lint (on by default)
# reads `rust-version` (1.88) and rejects any std API stabilized later.
cargo clippy --workspace --all-targets --all-features -- -D warnings
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --all-features
# The published crates as crates.io would get them, each built from its
# package (nothing is uploaded).
# Cargo verifies each against the others through a registry it makes in
# the target folder, unpacked into its home under a name taken from that
# folder's path, and it reuses an unpacked copy of the same version: a CI
# machine that checks out to the same path would verify against an
# earlier run's sources.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/lock-{limits,macros,runtime}-[0-9]*
cargo package -p lock-limits -p lock-macros -p lock-runtime
# The benchmark: a workspace of its own, checked in the workspace's target
# folder, where the dependencies the two share are built already.
target=${CARGO_TARGET_DIR:-target}
cargo clippy --manifest-path bench/Cargo.toml --target-dir "$target" --all-targets -- -D warnings
