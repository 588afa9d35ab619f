//! Durations too long to add to the clock (`Duration::MAX` meaning "no
//! limit", or a ceiling read from a config file) are taken as the far
//! future: no call panics on them.

use std::time::Duration;

use broker_core::config::{parse, Format};
use broker_core::{Cost, Limits, Outcome, RateLimit, ResourceBroker, ResourceConfig};
use broker_memory::MemoryBackend;

fn broker() -> ResourceBroker {
    let b = ResourceBroker::new(MemoryBackend::new());
    let limits = Limits::new()
        .rate(RateLimit::per_second(5))
        .max_concurrent(1);
    b.register_limit("r", limits).unwrap();
    b
}

#[tokio::test]
async fn acquire_waits_without_a_limit() {
    let b = broker();
    let got = b
        .acquire("r", Cost::default(), Duration::MAX)
        .await
        .unwrap();
    assert!(got.allowed);
}

#[tokio::test]
async fn penalize_stops_calls_without_a_limit() {
    let b = broker();
    b.penalize("r", Duration::MAX).await.unwrap();
    let got = b.try_acquire("r", Cost::default()).await.unwrap();
    assert!(!got.allowed, "held by the penalty");
}

#[tokio::test]
async fn enqueue_runs_under_a_ceiling_of_500_billion_years() {
    let json = r#"{
        "limits": { "requestsPerMinute": 500, "maxConcurrentRequests": 2 },
        "retry": { "waitCeiling": "500000000000years" }
    }"#;
    let config: ResourceConfig = parse("a.json", json, Format::Json).unwrap();
    let b = ResourceBroker::new(MemoryBackend::new());
    b.register("r", config).unwrap();
    let got = b
        .enqueue("r", Cost::default(), |_| async {
            Outcome::<u32, std::io::Error>::ok(7)
        })
        .await;
    assert_eq!(got.unwrap(), 7);
}

#[test]
fn a_manual_clock_stops_at_the_largest_time_instead_of_wrapping() {
    let clock = broker_core::ManualClock::new();
    clock.advance(Duration::from_secs(5));
    clock.advance(Duration::MAX);
    assert_eq!(broker_core::Clock::now(&clock), u64::MAX);
    clock.advance(Duration::from_secs(1));
    assert_eq!(broker_core::Clock::now(&clock), u64::MAX);
}

/// Buckets count whole microseconds: a period with a fraction of one is
/// rounded up, never down (1,999 ns taken as 1 µs would nearly double
/// the rate).
#[test]
fn a_period_with_a_fraction_of_a_microsecond_is_rounded_up() {
    let rate = RateLimit::per(1, Duration::from_nanos(1_999));
    assert_eq!(rate.params().period(), 2.0);
    let whole = RateLimit::per(1, Duration::from_micros(3));
    assert_eq!(whole.params().period(), 3.0);
}
