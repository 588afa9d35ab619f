//! `ResourceHandle` on the in-memory backend: the same answers, state and
//! counters as the broker's own `try_acquire`, and it follows
//! re-registration.

use std::time::Duration;

use broker_core::{BrokerError, Cost, Limits, ManualClock, RateLimit, ResourceBroker};
use broker_memory::MemoryBackend;

fn broker(clock: &ManualClock) -> ResourceBroker {
    ResourceBroker::new(MemoryBackend::with_clock(clock.clone()))
}

fn two_per_second() -> Limits {
    Limits::new().rate(RateLimit::per_second(2).with_burst(2))
}

#[test]
fn handle_shares_state_answers_and_counters_with_the_broker() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    broker.register_limit("tenants", two_per_second()).unwrap();
    let tenants = broker.resource_handle("tenants").unwrap();
    let via_handle = |key| {
        tenants
            .try_acquire_now(key, Cost::default())
            .expect("in-memory answers at once")
            .unwrap()
    };
    let via_broker = |key| {
        broker
            .try_acquire_now(("tenants", key), Cost::default())
            .expect("in-memory answers at once")
            .unwrap()
    };
    assert!(via_handle("a").allowed);
    assert!(via_broker("a").allowed);
    let handle_denied = via_handle("a");
    let broker_denied = via_broker("a");
    assert!(!handle_denied.allowed);
    assert_eq!(handle_denied.wait_time, Duration::from_millis(500));
    assert_eq!(handle_denied.wait_time, broker_denied.wait_time);
    assert_eq!(handle_denied.denied_by, broker_denied.denied_by);
    // Another sub-key and the whole resource have their own states.
    assert!(via_handle("b").allowed);
    let whole = tenants.try_acquire_now(None, Cost::default()).unwrap();
    assert!(whole.unwrap().allowed);
    let stats = &broker.stats().resources["tenants"];
    assert_eq!((stats.allowed, stats.denied), (4, 2));
}

#[tokio::test]
async fn handle_try_acquire_awaits_the_same_answer() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    broker.register_limit("tenants", two_per_second()).unwrap();
    let tenants = broker.resource_handle("tenants").unwrap();
    for _ in 0..2 {
        assert!(
            tenants
                .try_acquire("a", Cost::default())
                .await
                .unwrap()
                .allowed
        );
    }
    let denied = tenants.try_acquire("a", Cost::default()).await.unwrap();
    assert!(!denied.allowed);
    clock.advance(denied.wait_time);
    assert!(
        tenants
            .try_acquire("a", Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

#[test]
fn handle_follows_re_registration() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    broker.register_limit("tenants", two_per_second()).unwrap();
    let tenants = broker.resource_handle("tenants").unwrap();
    let one = Limits::new().rate(RateLimit::per_second(1).with_burst(1));
    broker.register_limit("tenants", one).unwrap();
    let take = || {
        tenants
            .try_acquire_now("a", Cost::default())
            .unwrap()
            .unwrap()
    };
    assert!(take().allowed);
    let denied = take();
    assert!(!denied.allowed, "the new burst of 1 applies");
    assert_eq!(denied.wait_time, Duration::from_secs(1));
    // Counted in the new registration's stats.
    let stats = &broker.stats().resources["tenants"];
    assert_eq!((stats.allowed, stats.denied), (1, 1));
}

#[test]
fn handle_refuses_a_cost_that_never_fits_and_unknown_resources() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    broker.register_limit("tenants", two_per_second()).unwrap();
    let tenants = broker.resource_handle("tenants").unwrap();
    let too_big = tenants
        .try_acquire_now("a", Cost::requests(3))
        .expect("refused at once");
    assert!(matches!(too_big, Err(BrokerError::CostNeverFits { .. })));
    assert!(matches!(
        broker.resource_handle("other"),
        Err(BrokerError::UnknownResource(id)) if id == "other"
    ));
}

/// `try_acquire` answers through the store's per-resource states (no state
/// key built); every other call reaches the same states by their joined,
/// escaped state keys. Sub-keys with separators, escapes and the empty
/// sub-key included.
#[tokio::test(start_paused = true)]
async fn the_fast_path_and_the_keyed_calls_share_one_state_per_sub_key() {
    let clock = ManualClock::new();
    let backend = std::sync::Arc::new(MemoryBackend::with_clock(clock.clone()));
    let broker = ResourceBroker::from_arc(backend.clone());
    let limits = two_per_second().max_concurrent(1);
    broker.register_limit("t:x", limits).unwrap();
    for sub in ["a", "a:b", "%3A", "{tag}", "", "é"] {
        let fast = broker
            .try_acquire_now(("t:x", sub), Cost::default())
            .expect("in-memory answers at once")
            .unwrap();
        assert!(fast.allowed, "{sub}");
        let state_key = broker_core::keys::keyed("t:x", sub);
        let state = backend.state(&state_key).expect("the keyed state exists");
        assert_eq!(state.leases.len(), 1, "{sub}: the in-process path's lease");
        // The only slot is held: the keyed path sees it.
        let held = broker
            .acquire(("t:x", sub), Cost::default(), Duration::ZERO)
            .await
            .unwrap();
        assert!(!held.allowed, "{sub}");
        drop(fast);
        assert!(
            backend.state(&state_key).unwrap().leases.is_empty(),
            "{sub}"
        );
        // A penalty through the keyed path holds the in-process path too.
        broker
            .penalize(("t:x", sub), Duration::from_secs(5))
            .await
            .unwrap();
        let after = broker
            .try_acquire_now(("t:x", sub), Cost::default())
            .unwrap()
            .unwrap();
        assert!(!after.allowed, "{sub}");
        assert_eq!(after.wait_time, Duration::from_secs(5), "{sub}");
    }
    // One state per sub-key (plus none for the resource itself).
    assert_eq!(backend.len(), 6);
    // A lease taken through the keyed calls is released by them too, on the
    // same state.
    let acquired = broker
        .acquire(("t:x", "late"), Cost::default(), Duration::ZERO)
        .await
        .unwrap();
    assert!(acquired.allowed);
    let late = broker_core::keys::keyed("t:x", "late");
    assert_eq!(backend.state(&late).unwrap().leases.len(), 1);
    drop(acquired);
    assert!(backend.state(&late).unwrap().leases.is_empty());
}

/// A state made under one registration, met under the next: with as many
/// buckets it keeps its tokens under the new limits; with another number
/// of buckets it starts afresh (the states are reached through the new
/// registration's per-resource states).
#[test]
fn a_state_follows_re_registration_of_its_resource() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    broker.register_limit("tenants", two_per_second()).unwrap();
    let take = || {
        broker
            .try_acquire_now(("tenants", "a"), Cost::default())
            .unwrap()
            .unwrap()
    };
    assert!(take().allowed && take().allowed);
    assert_eq!(take().wait_time, Duration::from_millis(500));
    // One bucket again, refilled at 1/s: the empty bucket is kept.
    let slower = Limits::new().rate(RateLimit::per_second(1).with_burst(2));
    broker.register_limit("tenants", slower).unwrap();
    let denied = take();
    assert!(!denied.allowed, "the spent burst is kept");
    assert_eq!(denied.wait_time, Duration::from_secs(1));
    // Two buckets: a fresh state.
    let two = two_per_second().rate(RateLimit::per_minute(100));
    broker.register_limit("tenants", two).unwrap();
    assert!(take().allowed && take().allowed);
    assert!(!take().allowed);
}

/// A one-bucket state is held compactly while its resource has no
/// concurrency limit; re-registered with one (same bucket), it keeps its
/// tokens and takes leases; without it again, it keeps its tokens too.
#[test]
fn a_state_keeps_its_tokens_when_a_concurrency_limit_comes_and_goes() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    let three = || Limits::new().rate(RateLimit::per_second(1).with_burst(3));
    broker.register_limit("api", three()).unwrap();
    let take = || {
        broker
            .try_acquire_now(("api", "a"), Cost::default())
            .unwrap()
            .unwrap()
    };
    assert!(take().allowed);
    broker
        .register_limit("api", three().max_concurrent(1))
        .unwrap();
    let held = take();
    assert!(
        held.allowed && held.permit.is_held(),
        "one of 3 tokens left"
    );
    let busy = take();
    assert!(!busy.allowed, "the only slot is held");
    drop(held);
    broker.register_limit("api", three()).unwrap();
    assert!(take().allowed, "the last token");
    let out = take();
    assert!(!out.allowed, "3 tokens taken across three registrations");
    assert_eq!(out.wait_time, Duration::from_secs(1));
}

/// A state of several limits, or with a concurrency limit, decided under
/// the read lock, follows its resource's registrations: the same limits
/// again keep it as it is, another concurrency limit applies to the slots
/// already held, and another number of limits starts afresh.
#[test]
fn a_state_of_several_limits_follows_re_registration() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    let slots = |n| {
        Limits::new()
            .rate(RateLimit::per_second(1).with_burst(3))
            .max_concurrent(n)
    };
    broker.register_limit("api", slots(3)).unwrap();
    let take = || {
        broker
            .try_acquire_now(("api", "a"), Cost::default())
            .unwrap()
            .unwrap()
    };
    let first = take();
    assert!(first.allowed && first.permit.is_held());
    // The same limits again: the held slot and the two tokens left stay.
    broker.register_limit("api", slots(3)).unwrap();
    let second = take();
    assert!(second.allowed && second.permit.is_held());
    // One slot now, and two are held.
    broker.register_limit("api", slots(1)).unwrap();
    assert!(
        !take().allowed,
        "the slots held count against the new limit"
    );
    drop((first, second));
    let last = take();
    assert!(last.allowed, "the last of 3 tokens");
    drop(last);
    assert!(!take().allowed, "3 tokens taken across three registrations");
    // Another limit: a fresh state, its burst whole.
    broker
        .register_limit("api", slots(1).rate(RateLimit::per_minute(100)))
        .unwrap();
    let fresh = take();
    assert!(fresh.allowed, "a fresh state of two limits");
    drop(fresh);
    for _ in 0..2 {
        assert!(take().allowed);
    }
    let out = take();
    assert!(!out.allowed);
    assert_eq!(out.wait_time, Duration::from_secs(1));
}

/// `try_acquire` decides when first polled: a future made and dropped
/// unpolled takes nothing and counts nothing, through the broker and
/// through a handle alike.
#[tokio::test]
async fn try_acquire_decides_on_the_first_poll_not_before() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    broker.register_limit("tenants", two_per_second()).unwrap();
    let tenants = broker.resource_handle("tenants").unwrap();
    for _ in 0..5 {
        drop(broker.try_acquire(("tenants", "a"), Cost::default()));
        drop(tenants.try_acquire("a", Cost::default()));
    }
    let stats = &broker.stats().resources["tenants"];
    assert_eq!((stats.allowed, stats.denied), (0, 0));
    let first = broker.try_acquire(("tenants", "a"), Cost::default());
    let second = tenants.try_acquire("a", Cost::default());
    let third = tenants.try_acquire("a", Cost::default());
    // Polled in the opposite order of creation: the third is the one denied.
    let third = third.await.unwrap();
    let second = second.await.unwrap();
    let first = first.await.unwrap();
    assert!(third.allowed && second.allowed && !first.allowed);
    assert_eq!(first.wait_time, Duration::from_millis(500));
}

/// The by-id lookup keeps the resource a thread found last: calls that
/// alternate between resources, between brokers, on ids of any length, and
/// across a re-registration each reach the resource they name.
#[test]
fn lookups_by_id_reach_the_resource_named_whatever_was_found_before() {
    let clock = ManualClock::new();
    let (a, b) = (broker(&clock), broker(&clock));
    let long = "a-resource-id-longer-than-thirty-two-bytes-of-text";
    // Ids of one length differing in their last byte.
    for (broker, ids) in [
        (&a, ["tenant-1", "tenant-2", long]),
        (&b, ["tenant-1", "tenant-3", long]),
    ] {
        for id in ids {
            broker.register_limit(id, two_per_second()).unwrap();
        }
    }
    let allowed = |broker: &ResourceBroker, id: &str| {
        broker
            .try_acquire_now(id, Cost::default())
            .expect("in-memory answers at once")
            .unwrap()
            .allowed
    };
    // Interleaved: each resource's burst of 2 goes to it alone.
    let calls = [
        (&a, "tenant-1"),
        (&a, "tenant-2"),
        (&b, "tenant-1"),
        (&a, long),
        (&b, long),
    ];
    for _ in 0..2 {
        for (broker, id) in calls {
            assert!(allowed(broker, id), "{id}");
        }
    }
    for (broker, id) in calls {
        assert!(!allowed(broker, id), "{id} has used its burst");
    }
    assert!(allowed(&b, "tenant-3"), "untouched so far");
    assert!(matches!(
        b.try_acquire_now("tenant-2", Cost::default()),
        Some(Err(BrokerError::UnknownResource(id))) if id == "tenant-2"
    ));
    // The resource found last, registered again: its calls are counted
    // by the new registration (the state, kept by key, is still empty).
    assert!(!allowed(&a, long));
    a.register_limit(long, two_per_second()).unwrap();
    assert!(!allowed(&a, long));
    let counted = |broker: &ResourceBroker, id: &str| {
        let s = &broker.stats().resources[id];
        (s.allowed, s.denied)
    };
    assert_eq!(counted(&a, long), (0, 1));
    assert_eq!(counted(&b, long), (2, 1));
    assert_eq!(counted(&a, "tenant-2"), (2, 1));
    assert_eq!(counted(&b, "tenant-3"), (1, 0));
}

/// A lease outlives registrations that keep its state (the concurrency
/// limit going, the state used without it, and the limit coming back, all
/// while the lease is held): its release frees the slot of the state in
/// use. Another number of limits starts the buckets full and keeps the
/// slots held.
#[test]
fn a_lease_outlives_registrations_that_keep_its_state() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    let rate = || Limits::new().rate(RateLimit::per_second(1000).with_burst(1000));
    broker
        .register_limit("api", rate().max_concurrent(1))
        .unwrap();
    let take = |k| {
        broker
            .try_acquire_now(("api", k), Cost::default())
            .unwrap()
            .unwrap()
    };
    let held = take("a");
    assert!(held.allowed && held.permit.is_held());
    assert!(!take("a").allowed, "the only slot is held");

    broker.register_limit("api", rate()).unwrap();
    assert!(take("a").allowed, "no concurrency limit now");
    broker
        .register_limit("api", rate().max_concurrent(1))
        .unwrap();
    assert!(!take("a").allowed, "the lease outlived both registrations");
    drop(held);
    let again = take("a");
    assert!(
        again.allowed,
        "the release freed the slot of the state in use"
    );

    broker
        .register_limit(
            "api",
            rate()
                .rate(RateLimit::per_minute(100_000))
                .max_concurrent(1),
        )
        .unwrap();
    assert!(
        !take("a").allowed,
        "another number of limits: full buckets, the slot still held"
    );
    drop(again);
    let fresh = take("a");
    assert!(fresh.allowed, "the earlier permit's release freed it");
    assert!(!take("a").allowed);
    drop(fresh);
    assert!(take("a").allowed);
}
