//! What the state bound's tests share: a bounded store with a broker on
//! it, and the calls they repeat.

#![allow(dead_code)] // Each test file uses its own part.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Cost, LimitSpec, Limits, LocalStore, ManualClock, Permit, ResourceBroker, Store,
};
use broker_memory::MemoryBackend;

/// The bound the tests set.
pub const BOUND: usize = 64;

/// A clock at a fixed, non-zero time.
pub fn clock() -> ManualClock {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    clock
}

/// A store bounded at [`BOUND`] on `clock`, and a broker on it.
pub fn bounded(clock: &ManualClock) -> (Arc<MemoryBackend>, ResourceBroker) {
    let backend = Arc::new(MemoryBackend::with_clock(clock.clone()).max_states(BOUND));
    let shared: Arc<dyn Store> = backend.clone();
    (backend, ResourceBroker::from_arc(shared))
}

/// `n` tries of tenant `key` of the broker's resource `tenant`; how many
/// were allowed.
pub fn take(broker: &ResourceBroker, key: &str, n: usize) -> usize {
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

/// The slots of `n` tenants `{tag}-{i}` of the broker's resource
/// `tenant`, each taken and held.
pub fn hold(broker: &ResourceBroker, tag: &str, n: usize) -> Vec<Permit> {
    (0..n)
        .map(|i| {
            let a = broker
                .try_acquire_now(("tenant", format!("{tag}-{i}").as_str()), Cost::default())
                .unwrap()
                .unwrap();
            assert!(a.allowed && a.permit.is_held());
            a.permit
        })
        .collect()
}

/// `limits` as a store's keyed calls take them.
pub fn spec(limits: Limits) -> LimitSpec {
    LimitSpec::new(&limits, Duration::from_secs(60))
}

/// `n` keyed tries of `key` under `spec`; how many were allowed.
pub fn tries(backend: &MemoryBackend, key: &str, spec: &LimitSpec, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            backend
                .try_acquire_now(key, spec, Cost::default())
                .expect("in-memory answers at once")
                .unwrap()
                .allowed
        })
        .count()
}
