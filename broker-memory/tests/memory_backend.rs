//! MemoryBackend: exact under contention, bounded under unbounded keys.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Cost, LimitSpec, Limits, LocalStore, ManualClock, RateLimit, Renewal, ResourceBroker, Store,
};
use broker_memory::MemoryBackend;

fn spec(limits: &Limits) -> LimitSpec {
    LimitSpec::new(limits, Duration::from_secs(60))
}

#[test]
fn threads_hammering_one_key_never_over_admit() {
    let clock = ManualClock::new();
    let backend = Arc::new(MemoryBackend::with_clock(clock.clone()));
    let limits = Limits::new()
        .rate(RateLimit::per_second(1000).with_burst(500))
        .max_concurrent(10_000);
    let spec = Arc::new(spec(&limits));
    let admitted = Arc::new(AtomicU64::new(0));
    for step in 0..10u64 {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (backend, spec, admitted) = (backend.clone(), spec.clone(), admitted.clone());
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        let d = backend
                            .try_acquire_now("k", &spec, Cost::default())
                            .unwrap()
                            .unwrap();
                        if d.allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            backend.release_now("k", d.lease.unwrap()).unwrap().unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Burst 500 at t = 0, then 1000/s: 100 more per 100 ms step.
        assert_eq!(admitted.load(Ordering::Relaxed), 500 + 100 * step);
        clock.advance(Duration::from_millis(100));
    }
}

#[tokio::test]
async fn a_million_distinct_keys_do_not_stay_alive() {
    let clock = ManualClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let spec = spec(&Limits::new().rate(RateLimit::per_second(10)));
    let mut peak = 0;
    for batch in 0..100 {
        for i in 0..10_000 {
            let key = format!("tenant-{batch}-{i}");
            let d = backend
                .try_acquire(&key, &spec, Cost::default())
                .await
                .unwrap();
            assert!(d.allowed);
        }
        peak = peak.max(backend.len());
        // 100 ms per batch: a key touched once is full again after 100 ms.
        clock.advance(Duration::from_millis(100));
    }
    assert!(
        peak < 100_000,
        "states kept alive: peak {peak} of 1,000,000 keys"
    );
    clock.advance(Duration::from_secs(1));
    backend.evict_idle();
    assert_eq!(backend.len(), 0, "every idle state is evicted");
}

#[tokio::test]
async fn a_penalized_state_is_not_evicted_before_its_penalty_ends() {
    let clock = ManualClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let spec = spec(&Limits::new().rate(RateLimit::per_second(10)));
    backend
        .penalize("held", &spec, Duration::from_secs(30))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    assert_eq!(backend.evict_idle(), 0);
    let d = backend
        .try_acquire("held", &spec, Cost::default())
        .await
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.wait, 20_000_000);
    clock.advance(Duration::from_secs(21));
    assert_eq!(backend.evict_idle(), 1);
}

/// The broker's in-process path (states reached by sub-key through
/// `LocalStore::states`) creates states in the same table the sweeps
/// bound: a flood of distinct tenants does not keep their states alive.
#[test]
fn a_flood_of_sub_keys_through_the_fast_path_does_not_stay_alive() {
    let clock = ManualClock::new();
    let backend = Arc::new(MemoryBackend::with_clock(clock.clone()));
    let broker = broker_core::ResourceBroker::from_arc(backend.clone());
    broker
        .register_limit("tenants", Limits::new().rate(RateLimit::per_second(10)))
        .unwrap();
    let tenants = broker.resource_handle("tenants").unwrap();
    let mut peak = 0;
    for batch in 0..50 {
        for i in 0..10_000 {
            let tenant = format!("tenant-{batch}-{i}");
            let a = tenants
                .try_acquire_now(tenant.as_str(), Cost::default())
                .expect("in-memory answers at once")
                .unwrap();
            assert!(a.allowed);
        }
        peak = peak.max(backend.len());
        clock.advance(Duration::from_millis(100));
    }
    assert!(
        peak < 50_000,
        "states kept alive: peak {peak} of 500,000 sub-keys"
    );
    clock.advance(Duration::from_secs(1));
    backend.evict_idle();
    assert_eq!(backend.len(), 0, "every idle state is evicted");
}

/// The same exactness through the broker's in-process path, with each permit
/// released through it too (8 slots for 4 threads: a leaked slot would
/// soon deny every call).
#[test]
fn threads_hammering_one_sub_key_through_the_fast_path_never_over_admit() {
    let limits = Limits::new()
        .rate(RateLimit::per_second(1000).with_burst(500))
        .max_concurrent(8);
    hammer_through_the_broker(limits);
}

/// [`hammer_one_key`] through the broker's in-process path, on one sub-key of a
/// resource of `limits`: a permit is held exactly when a concurrency
/// limit is set and the call admitted, and none is left after a step.
fn hammer_through_the_broker(limits: Limits) {
    let leased = limits.max_concurrent.is_some();
    let clock = ManualClock::new();
    let broker = broker_core::ResourceBroker::new(MemoryBackend::with_clock(clock.clone()));
    broker.register_limit("api", limits).unwrap();
    let handle = broker.resource_handle("api").unwrap();
    hammer_one_key(
        &clock,
        || {
            let a = handle.try_acquire_now("tenant-1", Cost::default());
            let a = a.unwrap().unwrap();
            assert_eq!(a.permit.is_held(), a.allowed && leased);
            a.allowed
        },
        || assert_eq!(broker.stats().resources["api"].in_flight, 0),
    );
}

/// Four threads trying one key, 2,000 times each per 100 ms step, against
/// a bucket of burst 500 refilled at 1000/s: `try_one` says whether a call
/// was admitted; `after_step` checks more after each step.
fn hammer_one_key(clock: &ManualClock, try_one: impl Fn() -> bool + Sync, after_step: impl Fn()) {
    let admitted = AtomicU64::new(0);
    for step in 0..10u64 {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..2_000 {
                        if try_one() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 500 + 100 * step);
        after_step();
        clock.advance(Duration::from_millis(100));
    }
}

/// A state of one rate limit and no concurrency limit is decided under its
/// shard's read lock, by several threads at once: still exact, through the
/// keyed calls and through the broker's in-process path.
#[test]
fn threads_hammering_one_bucket_never_over_admit() {
    let limits = Limits::new().rate(RateLimit::per_second(1000).with_burst(500));
    hammer_keyed(&limits);
    hammer_through_the_broker(limits);
}

/// [`hammer_one_key`] through the backend's keyed call, on key `k` of a
/// store of its own; the store, for a look at the state.
fn hammer_keyed(limits: &Limits) -> MemoryBackend {
    let clock = ManualClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let spec = spec(limits);
    hammer_one_key(
        &clock,
        || {
            let d = backend.try_acquire_now("k", &spec, Cost::default());
            d.unwrap().unwrap().allowed
        },
        || (),
    );
    backend
}

/// A state of several limits is decided under its shard's read lock and
/// its own lock, by several threads at once: still exact, through the
/// keyed calls and through the broker's in-process path.
#[test]
fn threads_hammering_one_state_of_two_limits_never_over_admit() {
    // The second limit never binds (a burst of 10^6, refilled at 1/s):
    // every decision still takes from both.
    let limits = Limits::new()
        .rate(RateLimit::per_second(1000).with_burst(500))
        .rate(RateLimit::per_minute(60).with_burst(1_000_000));
    let backend = hammer_keyed(&limits);
    // 1,400 taken, 0.9 refilled over the nine steps of 100 ms.
    let second = backend.state("k").unwrap().buckets[1].tokens;
    assert!(
        (second - (1_000_000.0 - 1_400.0 + 0.9)).abs() < 1e-3,
        "every decision took from both: {second}"
    );

    hammer_through_the_broker(limits);
}

/// Threads holding permits of a concurrency limit while others take and
/// release theirs, decided under the shards' read locks: never more
/// holders than slots, and every slot back at the end.
#[test]
fn threads_holding_permits_never_exceed_the_slots() {
    let limits = Limits::new()
        .rate(RateLimit::per_second(1_000_000).with_burst(1_000_000))
        .max_concurrent(3);
    let broker = broker_core::ResourceBroker::new(MemoryBackend::new());
    broker.register_limit("api", limits).unwrap();
    let handle = broker.resource_handle("api").unwrap();
    let (holding, most, granted) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..5_000 {
                    let a = handle.try_acquire_now("tenant-1", Cost::default());
                    let a = a.unwrap().unwrap();
                    if !a.allowed {
                        continue;
                    }
                    granted.fetch_add(1, Ordering::Relaxed);
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::Relaxed);
                    std::thread::yield_now();
                    holding.fetch_sub(1, Ordering::SeqCst);
                    drop(a.permit);
                }
            });
        }
    });
    assert!(
        most.load(Ordering::Relaxed) <= 3,
        "{most:?} holders at once"
    );
    assert!(granted.load(Ordering::Relaxed) > 0);
    let stats = &broker.stats().resources["api"];
    assert_eq!(stats.in_flight, 0);
    assert_eq!(stats.allowed, granted.load(Ordering::Relaxed));
    // All three slots are free again.
    let held: Vec<_> = (0..3)
        .map(|_| {
            handle
                .try_acquire_now("tenant-1", Cost::default())
                .unwrap()
                .unwrap()
        })
        .collect();
    assert!(held.iter().all(|a| a.allowed));
    let fourth = handle
        .try_acquire_now("tenant-1", Cost::default())
        .unwrap()
        .unwrap();
    assert!(!fourth.allowed);
}

/// Decisions under the read lock and bookings under the write lock on
/// one bucket at once: each of its tokens is handed out once.
#[test]
fn tries_and_bookings_at_once_share_one_bucket_exactly() {
    let clock = ManualClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    // One token a second, and time stands still: 3,000 tokens in all.
    let spec = spec(&Limits::new().rate(RateLimit::per_second(1).with_burst(3_000)));
    let granted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (backend, spec, granted) = (&backend, &spec, &granted);
            s.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for _ in 0..2_000 {
                    let got = if t % 2 == 0 {
                        let d = backend.try_acquire_now("k", spec, Cost::default());
                        d.unwrap().unwrap().allowed
                    } else {
                        let r = runtime.block_on(backend.book(
                            "k",
                            spec,
                            Cost::default(),
                            Duration::ZERO,
                        ));
                        r.unwrap().booked
                    };
                    if got {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(granted.load(Ordering::Relaxed), 3_000);
    assert_eq!(backend.state("k").unwrap().buckets[0].tokens, 0.0);
}

/// A key used within the last 50 ms stays, though its bucket is full again
/// (a generous limit refills between calls): a sweep does not drop a key
/// in use only for its next call to make it again.
#[tokio::test]
async fn a_key_in_use_is_kept_though_its_bucket_refills_between_calls() {
    let clock = ManualClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let spec = spec(&Limits::new().rate(RateLimit::per_second(1_000_000)));
    let d = backend.try_acquire("hot", &spec, Cost::default()).await;
    assert!(d.unwrap().allowed);
    clock.advance(Duration::from_millis(10));
    assert_eq!(backend.evict_idle(), 0, "full again, but used 10 ms ago");
    clock.advance(Duration::from_millis(40));
    assert_eq!(backend.evict_idle(), 1, "unused for 50 ms");
    assert!(backend.is_empty());
}

/// A sweep due on time runs under traffic made only of rate denials on
/// existing states: idle states do not stay until the next allowed call.
#[test]
fn idle_states_are_swept_on_time_under_denials_alone() {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let store = Arc::new(MemoryBackend::with_clock(clock.clone()));
    let shared: Arc<dyn Store> = store.clone();
    let broker = ResourceBroker::from_arc(shared);
    broker
        .register_limit("tenants", Limits::new().rate(RateLimit::per_second(1000)))
        .unwrap();
    broker
        .register_limit(
            "hot",
            Limits::new().rate(RateLimit::per_minute(1).with_burst(1)),
        )
        .unwrap();
    let tenants = broker.resource_handle("tenants").unwrap();
    let hot = broker.resource_handle("hot").unwrap();
    for i in 0..6000 {
        let key = format!("t{i}");
        let a = tenants.try_acquire_now(key.as_str(), Cost::default());
        assert!(a.unwrap().unwrap().allowed);
    }
    assert!(
        hot.try_acquire_now("x", Cost::default())
            .unwrap()
            .unwrap()
            .allowed
    );
    assert_eq!(store.len(), 6001);
    // Past the sweep interval, only denials on the hot key.
    clock.advance(Duration::from_secs(11));
    for _ in 0..100 {
        let a = hot.try_acquire_now("x", Cost::default());
        assert!(!a.unwrap().unwrap().allowed);
    }
    assert_eq!(store.len(), 1, "only the hot key's state is left");
}

/// `renew` extends a held lease; a lease not held is taken again while a
/// slot is free (`Retaken`), and is `Gone`, with nothing taken, once every
/// slot is held. (Before `retake` was folded into `renew`, a renewal never
/// took a slot, and made no state for a key that had none.)
#[tokio::test]
async fn renew_extends_a_held_lease_and_takes_a_gone_one_again_while_a_slot_is_free() {
    let backend = MemoryBackend::with_clock(ManualClock::new());
    let spec = spec(
        &Limits::new()
            .rate(RateLimit::per_second(10))
            .max_concurrent(2),
    );
    let d = backend
        .try_acquire("held", &spec, Cost::default())
        .await
        .unwrap();
    let lease = d.lease.expect("a concurrency limit leases a slot");
    let renewed = backend.renew("held", &spec, lease).await.unwrap();
    assert_eq!(renewed, Renewal::Held);
    let other = backend.renew("held", &spec, lease + 1).await.unwrap();
    assert_eq!(other, Renewal::Retaken, "the second slot was free");
    let third = backend.renew("held", &spec, lease + 2).await.unwrap();
    assert_eq!(third, Renewal::Gone, "both slots held: nothing taken");
    assert!(!backend.release("held", lease + 2).await.unwrap());
    assert!(backend.release("held", lease).await.unwrap());
    let again = backend.renew("held", &spec, lease).await.unwrap();
    assert_eq!(again, Renewal::Retaken);
    assert_eq!(backend.len(), 1);
}

/// The denials `LocalStates` gives are the waits the backend's keyed call
/// gives: two stores on one clock see the same calls (costs, fractional
/// refills, penalties) and answer alike, call by call, both while no
/// penalty is in force and right after a penalty longer than the refill.
#[tokio::test]
async fn local_denials_equal_the_backends_waits() {
    use broker_core::{keys, DenyReason};
    let clock = ManualClock::new();
    let local_store = MemoryBackend::with_clock(clock.clone());
    let keyed_store = MemoryBackend::with_clock(clock.clone());
    let limits = Limits::new().rate(RateLimit::per(7, Duration::from_millis(900)).with_burst(3));
    let spec = Arc::new(spec(&limits));
    let local = local_store.states("r", spec.clone()).unwrap();
    let joined = keys::keyed("r", "k");
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let (mut denials, mut at_penalty_end) = (0, 0);
    for step in 0..5_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        clock.advance(Duration::from_micros(seed % 200_000));
        let mut penalty = None;
        if step % 100 == 99 {
            let h = Duration::from_micros(seed % 600_000);
            local_store.penalize(&joined, &spec, h).await.unwrap();
            keyed_store.penalize(&joined, &spec, h).await.unwrap();
            penalty = Some(h.as_micros() as u64);
        }
        let cost = Cost::requests(1 + seed % 3);
        let ours = local.try_acquire(Some("k"), cost);
        let theirs = keyed_store.try_acquire(&joined, &spec, cost).await.unwrap();
        assert_eq!(ours, theirs, "step {step}");
        if ours.denied_by == Some(DenyReason::Rate) {
            let wait = ours.wait;
            denials += 1;
            // The clock has not moved since the penalty was put on: a wait of
            // exactly the penalty is the penalty's end.
            at_penalty_end += usize::from(penalty.is_some_and(|h| h > 0 && wait == h));
        }
    }
    assert!(denials > 1_000, "{denials} denials");
    assert!(
        at_penalty_end > 5,
        "{at_penalty_end} denials waited for a penalty's end"
    );
}
