//! Random cases run as plain tests: a proptest runner for
//! `PROPTEST_CASES` (else a default) cases, each numbered so that it can
//! take a key of its own.

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Runs `PROPTEST_CASES` (else `cases`) random cases of `strategy`,
/// keeping no failure file; `test` gets each case's number (from 0) and
/// value. Panics with the first failing case, shrunk.
pub fn run_numbered<S: Strategy>(
    cases: u32,
    strategy: &S,
    test: impl Fn(u64, S::Value) -> Result<(), TestCaseError>,
) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let n = AtomicU64::new(0);
    runner
        .run(strategy, |value| {
            test(n.fetch_add(1, Ordering::Relaxed), value)
        })
        .unwrap();
}
