//! [`Store`]: what a [`crate::MemoryBackend`] and the per-resource states
//! it hands out share, and the transitions on it. Each transition finds
//! its state under the shard's read lock and runs broker-core's reference
//! transition under the state's own mutex; only a new state takes the
//! shard's write lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use broker_core::state::{self, Decision, LimitSpec, ResourceState};
use broker_core::{Clock, Cost, LeaseId, Micros};
use parking_lot::Mutex;

use crate::eviction::Sweeper;
use crate::key::KeyRef;
use crate::spill::Spills;
use crate::states::{Entry, States};

/// The states of a store, its clock and what bounds its memory.
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) states: States,
    pub(crate) sweeper: Sweeper,
    pub(crate) spills: Spills,
    /// The resources whose own state a registration decides on, with how
    /// many registrations do: the sweeper keeps those states.
    pub(crate) registered: Mutex<HashMap<Arc<str>, usize>>,
    /// The spec of the last keyed call that made a state, so the states
    /// of one resource share one copy.
    last_spec: Mutex<Option<Arc<LimitSpec>>>,
}

impl Store {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            states: States::new(),
            sweeper: Sweeper::default(),
            spills: Spills::new(),
            registered: Mutex::new(HashMap::new()),
            last_spec: Mutex::new(None),
        }
    }

    /// `spec` as a shared allocation: the last one made if equal.
    pub(crate) fn shared_spec(&self, spec: &LimitSpec) -> Arc<LimitSpec> {
        let mut last = self.last_spec.lock();
        match &*last {
            Some(s) if **s == *spec => s.clone(),
            _ => {
                let s = Arc::new(spec.clone());
                *last = Some(s.clone());
                s
            }
        }
    }

    /// Runs the reference transition `f` on the state of `key`, made for
    /// `spec` (`shared` gives the allocation of `spec` a state keeps),
    /// making the state if there is none: from what the bound kept of it
    /// (see [`crate::spill`]), else fresh. `resource` is the caller's
    /// allocation of `key.resource`, if it has one.
    pub(crate) fn with_state<R>(
        &self,
        key: KeyRef<'_>,
        resource: Option<&Arc<str>>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        f: impl FnOnce(&mut ResourceState, Micros) -> R,
    ) -> R {
        let now = self.clock.now();
        let (result, inserted) = match self.states.get(key) {
            Some(e) => (f(e.lock().current(spec, &shared, now), now), false),
            None => self.states.upsert(
                key,
                || key.to_owned_with(resource),
                |hash| match self.spills.restore(key.resource, hash, spec, now) {
                    Some(kept) => Entry::with(shared(), kept),
                    None => Entry::new(shared(), spec, now),
                },
                |e| f(e.current(spec, &shared, now), now),
            ),
        };
        // Every decision, a denial too, checks whether a sweep is due: one
        // is due on time as well as on growth.
        self.sweeper.after_write(self, now, inserted);
        result
    }

    /// [`Store::with_state`] on a state that exists: `None`, and nothing
    /// made, when `key` has none.
    pub(crate) fn with_existing<R>(
        &self,
        key: KeyRef<'_>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        f: impl FnOnce(&mut ResourceState, Micros) -> R,
    ) -> Option<R> {
        let now = self.clock.now();
        let e = self.states.get(key)?;
        let mut e = e.lock();
        Some(f(e.current(spec, shared, now), now))
    }

    /// `try` on the state of `key` (arguments as for [`Store::with_state`]).
    pub(crate) fn try_acquire(
        &self,
        key: KeyRef<'_>,
        resource: Option<&Arc<str>>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        cost: Cost,
    ) -> Decision {
        let lease = lease_for(spec);
        self.with_state(key, resource, spec, shared, |s, now| {
            state::try_acquire(s, spec, now, cost, lease)
        })
    }

    /// Frees the slot held under `lease` on the state of `key`.
    pub(crate) fn release(&self, key: KeyRef<'_>, lease: LeaseId) -> bool {
        self.states
            .get(key)
            .is_some_and(|e| state::release(&mut e.lock().state, lease))
    }

    /// The state of `key`, if held.
    pub(crate) fn state(&self, key: KeyRef<'_>) -> Option<ResourceState> {
        self.states.get(key).map(|e| e.lock().state.clone())
    }

    /// A registration of `resource` decides on its own state: the
    /// sweeper keeps that state until [`Store::unregister_own`].
    pub(crate) fn register_own(&self, resource: &Arc<str>) {
        *self.registered.lock().entry(resource.clone()).or_default() += 1;
    }

    /// The end of a [`Store::register_own`].
    pub(crate) fn unregister_own(&self, resource: &str) {
        let mut registered = self.registered.lock();
        if let Some(n) = registered.get_mut(resource) {
            *n -= 1;
            if *n == 0 {
                registered.remove(resource);
            }
        }
    }
}

/// A new lease id, unique in the process (never 0).
pub(crate) fn next_lease() -> LeaseId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A lease id for a `try` under `spec` (none needed without a concurrency
/// limit).
pub(crate) fn lease_for(spec: &LimitSpec) -> LeaseId {
    if spec.max_concurrent.is_some() {
        next_lease()
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lease ids from threads taking them at once: never 0 (no lease),
    /// never one twice.
    #[test]
    fn lease_ids_are_unique_across_threads() {
        let ids: Vec<LeaseId> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..3_000).map(|_| next_lease()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        assert!(!ids.contains(&0));
    }
}
