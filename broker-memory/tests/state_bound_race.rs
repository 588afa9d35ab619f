//! The state bound under threads: decisions racing folds and restores
//! (frozen clock: no key is ever allowed more than its burst), and folds
//! and restores of states of two numbers of buckets under one resource
//! part running at once, to the end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Cost, LimitSpec, Limits, LocalStore, ManualClock, RateLimit, ResourceBroker, Store,
};
use broker_memory::MemoryBackend;

fn run(limits: Limits, burst: usize) {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let backend = Arc::new(MemoryBackend::with_clock(clock.clone()).max_states(64));
    let shared: Arc<dyn Store> = backend.clone();
    let broker = ResourceBroker::from_arc(shared);
    broker.register_limit("tenant", limits).unwrap();
    const HOT: usize = 16;
    let allowed: Vec<AtomicUsize> = (0..HOT).map(|_| AtomicUsize::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..3 {
            let (broker, allowed) = (&broker, &allowed);
            s.spawn(move || {
                for i in 0..6_000 {
                    let flood = format!("flood-{t}-{i}");
                    let _ = broker.try_acquire_now(("tenant", flood.as_str()), Cost::default());
                    let h = (i * 7 + t) % HOT;
                    let key = format!("hot-{h}");
                    let a = broker
                        .try_acquire_now(("tenant", key.as_str()), Cost::default())
                        .unwrap()
                        .unwrap();
                    if a.allowed {
                        allowed[h].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert!(backend.folded() > 10_000);
    for (h, n) in allowed.iter().enumerate() {
        let n = n.load(Ordering::Relaxed);
        assert!(n <= burst, "hot-{h} allowed {n} times, burst {burst}");
    }
}

#[test]
fn racing_decisions_never_pass_the_burst_one_bucket() {
    run(Limits::new().rate(RateLimit::per_minute(5)), 5);
}

#[test]
fn racing_decisions_never_pass_the_burst_two_buckets_and_slots() {
    run(
        Limits::new()
            .rate(RateLimit::per_minute(5))
            .rate(RateLimit::per(100, Duration::from_secs(3600)))
            .max_concurrent(1000),
        5,
    );
}

/// Keyed calls of two specs (1 and 2 buckets) under one resource part,
/// from three threads: folds fill places (the places' lock) while new keys
/// restore from them, both under shard locks.
#[test]
fn folds_and_restores_of_two_specs_do_not_deadlock() {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let backend = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let one = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(5)),
        Duration::from_secs(60),
    );
    let two = LimitSpec::new(
        &Limits::new()
            .rate(RateLimit::per_minute(5))
            .rate(RateLimit::per_second(100))
            .max_concurrent(3),
        Duration::from_secs(60),
    );
    std::thread::scope(|s| {
        for t in 0..3 {
            let (backend, one, two, clock) = (&backend, &one, &two, &clock);
            s.spawn(move || {
                for i in 0..20_000 {
                    let spec = if (i + t) % 2 == 0 { one } else { two };
                    backend.try_acquire_now(&format!("r:k-{t}-{}", i % 500), spec, Cost::default());
                    if i % 1000 == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                }
            });
        }
    });
    assert!(backend.folded() > 0);
}
