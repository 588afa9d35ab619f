//! [`Store`]: what a [`crate::MemoryBackend`] and its per-resource handles
//! share. A transition runs under the state's own mutex and the shard's read
//! lock; only a new state takes the shard's write lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use broker_core::state::{self, LimitSpec, ResourceState};
use broker_core::{Clock, LeaseId, Micros};
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
    /// Resources whose own state registrations decide on, with how many do.
    pub(crate) registered: Mutex<HashMap<Arc<str>, usize>>,
    /// The spec of the last keyed call, so a resource's states share one copy.
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

    /// Runs the reference transition `f` on the state of `key` for `spec`
    /// (`shared` gives the allocation a state keeps), making the state from
    /// its folded places, else fresh. `resource`: an allocation of its part.
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
                |hash| match self.spills.restore(hash, spec, now) {
                    Some(state) => Entry {
                        spec: shared(),
                        state,
                    },
                    None => Entry::new(shared(), spec, now),
                },
                |e| f(e.current(spec, &shared, now), now),
            ),
        };
        self.sweeper.after_write(self, now, inserted);
        result
    }

    /// [`Store::with_state`] on a state that exists: `None` when there is none.
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

    /// Frees the slot held under `lease` on the state of `key`.
    pub(crate) fn release(&self, key: KeyRef<'_>, lease: LeaseId) -> bool {
        self.states
            .get(key)
            .is_some_and(|e| state::release(&mut e.lock().state, lease))
    }

    /// A registration decides on `resource`'s own state: the sweeper keeps it.
    pub(crate) fn register_own(&self, resource: &Arc<str>) {
        *self.registered.lock().entry(resource.clone()).or_default() += 1;
    }

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

/// A lease id for a `try` under `spec` (0 without a concurrency limit).
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
