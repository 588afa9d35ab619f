//! A store that answers without I/O but hands out no per-resource states
//! (`Store::local_states` left at its default): the broker's synchronous
//! `try_acquire` then goes through the keyed `try_acquire_now` with the
//! joined state key, and a held permit is released by that key.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Cost, Limits, LocalStates, ManualClock, RateLimit, ResourceBroker};
use broker_memory::MemoryBackend;
use broker_testkit::{Hooks, Wrapped};

/// `MemoryBackend` with its keyed calls only. With a broker, its
/// `try_acquire_now` first makes a call on that broker (a store that calls
/// a broker from within a decision).
struct KeyedOnly(Option<ResourceBroker>);

impl Hooks for KeyedOnly {
    fn before_try_acquire_now(&self) {
        if let Some(nested) = &self.0 {
            let _ = nested.try_acquire_now("nested", Cost::default());
        }
    }
    fn local_states(&self, _: Arc<dyn LocalStates>) -> Option<Arc<dyn LocalStates>> {
        None
    }
}

fn keyed_only(store: Arc<MemoryBackend>, nested: Option<ResourceBroker>) -> Wrapped<KeyedOnly> {
    Wrapped::new(store, KeyedOnly(nested))
}

#[test]
fn a_store_without_local_states_answers_and_releases_by_the_joined_key() {
    let store = Arc::new(MemoryBackend::with_clock(ManualClock::new()));
    let broker = ResourceBroker::new(keyed_only(store.clone(), None));
    let limits = Limits::new()
        .rate(RateLimit::per_second(2).with_burst(2))
        .max_concurrent(1);
    broker.register_limit("t:x", limits).unwrap();
    let now = |sub| {
        broker
            .try_acquire_now(("t:x", sub), Cost::default())
            .expect("the store answers without I/O")
            .unwrap()
    };
    let held = now("a:b");
    assert!(held.allowed && held.permit.is_held());
    let state_key = broker_core::keys::keyed("t:x", "a:b");
    assert_eq!(store.state(&state_key).unwrap().leases.len(), 1);
    let busy = now("a:b");
    assert!(!busy.allowed, "the only slot is held");
    drop(held);
    assert!(store.state(&state_key).unwrap().leases.is_empty());
    let again = now("a:b");
    assert!(again.allowed, "the released slot is free again");
    drop(again);
    let out = now("a:b");
    assert!(!out.allowed, "the burst of 2 is spent");
    assert_eq!(out.wait_time, Duration::from_millis(500));
}

/// A call on one broker made from within a call on another (here, from
/// within a store's decision) leaves each broker's thread cache naming its
/// own resources: the next call on the inner broker is decided on its own
/// resource, not on the one the outer call had out.
#[test]
fn a_call_made_from_within_a_call_leaves_each_broker_its_own_resources() {
    let inner = ResourceBroker::new(MemoryBackend::with_clock(ManualClock::new()));
    inner
        .register_limit("nested", Limits::new().rate(RateLimit::per_second(1)))
        .unwrap();
    let outer_store = Arc::new(MemoryBackend::with_clock(ManualClock::new()));
    let outer = ResourceBroker::new(keyed_only(outer_store, Some(inner.clone())));
    outer
        .register_limit(
            "outer",
            Limits::new().rate(RateLimit::per_second(1).with_burst(100)),
        )
        .unwrap();
    let first = outer
        .try_acquire_now("outer", Cost::default())
        .unwrap()
        .unwrap();
    assert!(first.allowed);
    // The nested call took the inner resource's only token.
    let again = inner
        .try_acquire_now("nested", Cost::default())
        .unwrap()
        .unwrap();
    assert!(!again.allowed, "the inner resource's burst of 1 is spent");
    let stats = inner.stats();
    let nested = stats.resources.get("nested").expect("registered");
    assert_eq!((nested.allowed, nested.denied), (1, 1));
}
