//! The seed scenario of DESIGN.md, exactly, in virtual time, on the
//! in-memory backend (the conformance suite runs the same functions on
//! Redis).

mod common;

use broker_core::ManualClock;
use broker_memory::MemoryBackend;
use broker_testkit::Tally;
use common::seed::*;

const S: u64 = 1_000_000;

#[tokio::test]
async fn shared_bucket_spaces_eight_jobs_and_the_strict_server_accepts_all() {
    let backend = MemoryBackend::with_clock(ManualClock::new());
    let sends = shared_bucket_send_times(&backend, "seed").await;
    assert_eq!(sends, [0, 0, 0, S / 2, S, 3 * S / 2, 2 * S, 5 * S / 2]);
    assert_eq!(replay(&sends), Tally { ok: 8, rejected: 0 });
}

#[tokio::test]
async fn separate_buckets_send_six_at_once_and_half_are_rejected() {
    let backend = MemoryBackend::with_clock(ManualClock::new());
    let sends = separate_buckets_send_times(&backend, "seed").await;
    assert_eq!(sends.iter().filter(|&&t| t == 0).count(), 6);
    assert_eq!(replay(&sends), Tally { ok: 4, rejected: 4 });
}

#[tokio::test]
async fn penalty_at_two_and_a_half_seconds_holds_both_next_bookings_to_four() {
    let clock = ManualClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    shared_bucket_send_times(&backend, "seed").await;
    let got = penalty_then_two_bookings(&backend, &clock, "seed").await;
    assert_eq!(got, [4 * S, 4 * S]);
}
