//! The bound on the number of states: a flood of new keys keeps the store
//! within it, and a key dropped at the bound comes back with no more than
//! it had (no limit is multiplied by dropping its state).

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Backend, Cost, Limits, ManualClock, RateLimit, ResourceBroker};
use broker_memory::MemoryBackend;

const BOUND: usize = 64;

fn bounded(clock: &ManualClock) -> (Arc<MemoryBackend>, ResourceBroker) {
    let backend = Arc::new(MemoryBackend::with_clock(clock.clone()).max_states(BOUND));
    let shared: Arc<dyn Backend> = backend.clone();
    (backend, ResourceBroker::from_arc(shared))
}

/// `n` tries of tenant `key`; how many were allowed.
fn take(broker: &ResourceBroker, key: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            broker
                .try_acquire_now(("tenant", key), Cost::default())
                .expect("in-memory answers at once")
                .unwrap()
                .allowed
        })
        .count()
}

/// One try each of `keys` new keys; how many were allowed.
fn flood(broker: &ResourceBroker, keys: usize) -> usize {
    (0..keys)
        .map(|i| take(broker, &format!("flood-{i}"), 1))
        .sum()
}

fn five_a_minute() -> Limits {
    Limits::new().rate(RateLimit::per_minute(5))
}

#[test]
fn a_flood_of_new_keys_stays_within_the_bound() {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let (backend, broker) = bounded(&clock);
    broker.register_limit("tenant", five_a_minute()).unwrap();
    let mut most = 0;
    for i in 0..10_000 {
        take(&broker, &format!("flood-{i}"), 1);
        most = most.max(backend.len());
    }
    // The resource's own state is pinned by its registration and kept.
    assert!(most <= BOUND + 1, "{most} states held at most");
    assert!(backend.folded() >= 10_000 - BOUND as u64);
}

#[test]
fn a_key_dropped_at_the_bound_comes_back_with_no_more_than_it_had() {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let (backend, broker) = bounded(&clock);
    broker.register_limit("tenant", five_a_minute()).unwrap();
    assert_eq!(take(&broker, "drained", 9), 5);
    assert_eq!(take(&broker, "used-one", 1), 1);
    // Well over the bound, well under its places (1,024): no time passes,
    // so nothing refills, yet the new keys are not denied.
    assert!(flood(&broker, 200) >= 195);
    assert!(backend.len() <= BOUND + 1);
    assert!(backend.folded() > 100);

    let denied = broker
        .try_acquire_now(("tenant", "drained"), Cost::default())
        .unwrap()
        .unwrap();
    assert!(!denied.allowed, "dropped and made again, still drained");
    assert_eq!(
        denied.wait_time,
        Duration::from_secs(12),
        "one token per 12 s"
    );
    // Never more than it had: 4; less only if flood keys that shared its
    // place took more than one between them.
    let again = take(&broker, "used-one", 9);
    assert!((1..=4).contains(&again), "{again}");
    // Keys never seen mostly start full (most places hold no flood key).
    let full = (0..100)
        .filter(|i| take(&broker, &format!("new-{i}"), 5) == 5)
        .count();
    assert!(full >= 50, "{full} of 100 new keys started full");

    // A place refills as a bucket does: after a minute all is fresh.
    clock.advance(Duration::from_secs(60));
    assert_eq!(take(&broker, "drained", 9), 5);
}

#[test]
fn a_state_holding_a_slot_is_never_dropped() {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let (backend, broker) = bounded(&clock);
    let limits = five_a_minute().max_concurrent(1);
    broker.register_limit("tenant", limits).unwrap();
    let held: Vec<_> = (0..10)
        .map(|i| {
            let a = broker
                .try_acquire_now(("tenant", format!("holder-{i}").as_str()), Cost::default())
                .unwrap()
                .unwrap();
            assert!(a.allowed && a.permit.is_held());
            a.permit
        })
        .collect();
    for i in 0..200 {
        let key = format!("flood-{i}");
        let mut a = broker
            .try_acquire_now(("tenant", key.as_str()), Cost::default())
            .unwrap()
            .unwrap();
        assert!(a.allowed);
        a.permit.release();
    }
    assert!(backend.folded() > 0);
    for i in 0..10 {
        let again = broker
            .try_acquire_now(("tenant", format!("holder-{i}").as_str()), Cost::default())
            .unwrap()
            .unwrap();
        assert!(!again.allowed, "holder-{i}'s slot is still counted");
    }
    drop(held);
    for i in 0..10 {
        let again = broker
            .try_acquire_now(("tenant", format!("holder-{i}").as_str()), Cost::default())
            .unwrap()
            .unwrap();
        assert!(again.allowed, "released, holder-{i}'s slot is free");
    }
}

/// A state of several rate limits is folded bucket by bucket.
#[test]
fn every_bucket_of_a_dropped_state_is_kept() {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let (backend, broker) = bounded(&clock);
    let limits = Limits::new()
        .rate(RateLimit::per_second(100).with_burst(100))
        .rate(RateLimit::per(3, Duration::from_secs(3600)));
    broker.register_limit("tenant", limits).unwrap();
    assert_eq!(take(&broker, "hourly", 5), 3);
    flood(&broker, 1_000);
    assert!(backend.folded() > 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        take(&broker, "hourly", 5),
        0,
        "the hourly bucket is still empty"
    );
}

/// Bounds below the least are raised to it.
#[test]
fn a_bound_below_the_least_is_raised() {
    assert_eq!(MemoryBackend::new().max_states(0).state_bound(), 64);
    assert_eq!(MemoryBackend::new().state_bound(), 1 << 20);
}
