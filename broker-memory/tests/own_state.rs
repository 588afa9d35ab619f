//! A resource's own state (no sub-key), which a registration decides on
//! through a pin rather than the table: one state with the keyed calls,
//! exact under threads while other transitions change it, kept by the
//! sweeper while registered, and following re-registrations as a sub-key's
//! state does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Acquisition, Cost, Limits, LocalStore, ManualClock, RateLimit, ResourceBroker, Store,
};
use broker_memory::MemoryBackend;

fn broker(clock: &ManualClock) -> (ResourceBroker, Arc<MemoryBackend>) {
    let backend = Arc::new(MemoryBackend::with_clock(clock.clone()));
    let shared: Arc<dyn Store> = backend.clone();
    (ResourceBroker::from_arc(shared), backend)
}

fn take(broker: &ResourceBroker, resource: &str) -> Acquisition {
    broker
        .try_acquire_now(resource, Cost::default())
        .expect("in-memory answers at once")
        .unwrap()
}

/// Decisions through the pin, the keyed transitions (a penalty, a
/// settlement) and the inspection all meet one state.
#[tokio::test]
async fn decisions_and_keyed_transitions_meet_one_state() {
    let clock = ManualClock::new();
    let (broker, backend) = broker(&clock);
    let limits = Limits::new().rate(RateLimit::per_second(2).with_burst(2));
    broker.register_limit("gw", limits).unwrap();
    assert!(take(&broker, "gw").allowed);
    assert_eq!(backend.state("gw").unwrap().buckets[0].tokens, 1.0);

    broker.penalize("gw", Duration::from_secs(3)).await.unwrap();
    let held = take(&broker, "gw");
    assert!(!held.allowed, "the penalty reaches the pinned decisions");
    assert_eq!(held.wait_time, Duration::from_secs(3));

    clock.advance(Duration::from_secs(3));
    assert!(take(&broker, "gw").allowed);
    assert!(take(&broker, "gw").allowed);
    assert!(!take(&broker, "gw").allowed, "the burst of 2, spent");
    // A settlement below the booked cost gives the difference back.
    broker
        .settle("gw", Cost::requests(1), Cost::requests(0), None)
        .await
        .unwrap();
    assert_eq!(backend.state("gw").unwrap().buckets[0].tokens, 1.0);
    assert!(take(&broker, "gw").allowed, "the token given back");
    assert!(!take(&broker, "gw").allowed);
}

/// Threads deciding through the pin while another thread gives tokens back
/// (each settlement claims the bucket as a decision does), on a clock that
/// stands still and a bucket spent beforehand: what is admitted and what
/// is left add up to exactly what was given back.
#[test]
fn decisions_through_the_pin_are_exact_while_settlements_change_the_state() {
    let clock = ManualClock::new();
    let (broker, backend) = broker(&clock);
    let limits = Limits::new().rate(RateLimit::per_minute(1).with_burst(5_000));
    broker.register_limit("gw", limits).unwrap();
    for _ in 0..5_000 {
        assert!(take(&broker, "gw").allowed);
    }
    assert!(!take(&broker, "gw").allowed);
    const GIVEN_BACK: u64 = 2_000;
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..4_000 {
                    if take(&broker, "gw").allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        s.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            for _ in 0..GIVEN_BACK {
                runtime
                    .block_on(broker.settle("gw", Cost::requests(1), Cost::requests(0), None))
                    .unwrap();
            }
        });
    });
    let left = backend.state("gw").unwrap().buckets[0].tokens;
    let admitted = admitted.load(Ordering::Relaxed);
    assert_eq!(
        admitted as f64 + left,
        GIVEN_BACK as f64,
        "admitted {admitted}, {left} left"
    );
}

/// The sweeper keeps a registered resource's own state though it is idle
/// (its registration decides on it without the table), and evicts it once
/// no registration holds it: here, once its broker is gone. The decision
/// is made on a thread of its own, joined (so its thread-locals are gone
/// too), since a thread keeps the registry it read last until it reads
/// another one or exits.
#[test]
fn an_idle_own_state_is_kept_while_registered_and_evicted_after() {
    let clock = ManualClock::new();
    let (broker, backend) = broker(&clock);
    let limits = Limits::new().rate(RateLimit::per_second(10));
    broker.register_limit("gw", limits).unwrap();
    let on_thread = broker.clone();
    std::thread::spawn(move || assert!(take(&on_thread, "gw").allowed))
        .join()
        .unwrap();
    clock.advance(Duration::from_secs(60));
    assert_eq!(backend.evict_idle(), 0, "pinned by its registration");
    assert_eq!(backend.len(), 1);
    drop(broker);
    assert_eq!(
        backend.evict_idle(),
        1,
        "idle, and no registration holds it"
    );
    assert!(backend.is_empty());
}

/// The own state follows re-registration as a sub-key's state does: as
/// many buckets keep their tokens, whether a concurrency limit comes or
/// goes; another number of buckets starts afresh.
#[test]
fn the_own_state_follows_re_registration() {
    let clock = ManualClock::new();
    let (broker, _backend) = broker(&clock);
    let three = || Limits::new().rate(RateLimit::per_second(1).with_burst(3));
    broker.register_limit("api", three()).unwrap();
    let handle = broker.resource_handle("api").unwrap();
    let via_handle = || {
        handle
            .try_acquire_now(None, Cost::default())
            .unwrap()
            .unwrap()
    };
    assert!(take(&broker, "api").allowed);
    broker
        .register_limit("api", three().max_concurrent(1))
        .unwrap();
    let held = via_handle();
    assert!(held.allowed && held.permit.is_held(), "2 of 3 tokens taken");
    assert!(!take(&broker, "api").allowed, "the only slot is held");
    drop(held);
    broker.register_limit("api", three()).unwrap();
    assert!(via_handle().allowed, "the last token");
    let out = take(&broker, "api");
    assert!(!out.allowed, "3 tokens taken across three registrations");
    assert_eq!(out.wait_time, Duration::from_secs(1));
    // Two buckets: a fresh state, its burst whole.
    broker
        .register_limit("api", three().rate(RateLimit::per_minute(100)))
        .unwrap();
    for _ in 0..3 {
        assert!(via_handle().allowed);
    }
    assert!(!take(&broker, "api").allowed);
}

/// A decision through the previous registration, in flight as a
/// re-registration adds a concurrency limit, replaces the state and
/// retires the new registration's pin: the new registration pins it again,
/// and so keeps it (the sweeper leaves it alone), with its leases exact.
#[test]
fn a_late_decision_through_the_old_registration_does_not_unpin_the_new_one() {
    use broker_core::state::LimitSpec;
    use broker_core::Decision;

    let clock = ManualClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let rate = || RateLimit::per_second(10);
    let ttl = Duration::from_secs(60);
    let old = Arc::new(LimitSpec::new(&Limits::new().rate(rate()), ttl));
    let new = Arc::new(LimitSpec::new(
        &Limits::new().rate(rate()).max_concurrent(5),
        ttl,
    ));
    let lease = |d: Decision| match d.lease {
        Some(l) if d.allowed => l,
        _ => panic!("expected a lease, got {d:?}"),
    };
    let r1 = backend.states("api", old).unwrap();
    assert!(r1.try_acquire(None, Cost::default()).allowed);
    let r2 = backend.states("api", new).unwrap();
    assert!(r2.release(None, lease(r2.try_acquire(None, Cost::default()))));
    clock.advance(Duration::from_secs(60));
    assert_eq!(backend.evict_idle(), 0, "pinned by the new registration");

    // The late decision through the old registration.
    assert!(r1.try_acquire(None, Cost::default()).allowed);
    drop(r1);
    let held = lease(r2.try_acquire(None, Cost::default()));
    clock.advance(Duration::from_secs(1));
    assert!(r2.release(None, held), "the lease is found");
    assert!(!r2.release(None, held), "a lease is released once");
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        backend.evict_idle(),
        0,
        "still pinned by the new registration"
    );
    assert_eq!(backend.len(), 1);
    drop(r2);
    assert_eq!(
        backend.evict_idle(),
        1,
        "evicted once no registration holds it"
    );
}

/// Traffic on the own state alone (through its pin, no table write) still
/// sweeps idle sub-keys once a sweep is due.
#[test]
fn traffic_on_the_own_state_alone_sweeps_idle_sub_keys() {
    let clock = ManualClock::new();
    let (broker, backend) = broker(&clock);
    let limits = Limits::new().rate(RateLimit::per_second(1000));
    broker.register_limit("api", limits).unwrap();
    assert!(take(&broker, "api").allowed);
    for i in 0..20_000 {
        let tenant = format!("t{i}");
        let _ = broker.try_acquire_now(("api", tenant.as_str()), Cost::default());
    }
    let flooded = backend.len();
    assert!(flooded > 10_000, "{flooded}");
    clock.advance(Duration::from_secs(3600));
    for _ in 0..10 {
        assert!(take(&broker, "api").allowed);
    }
    assert!(
        backend.len() < 10,
        "{} states left of {flooded}",
        backend.len()
    );
}
