//! Compile-time behaviour of `#[distributed_lock]`: what must build, and the
//! exact errors (with spans) for what must not. Regenerate the `.stderr`
//! files with `TRYBUILD=overwrite` and review every diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
