//! [`Store`]: the states a [`crate::MemoryBackend`] and its handles share, in
//! a randomly seeded [`DashMap`] keyed by [`StateKey`], each behind its own mutex.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use broker_core::state::{self, LimitSpec, ResourceState};
use broker_core::{Clock, LeaseId, Micros};
use dashmap::DashMap;
use parking_lot::Mutex;

use crate::eviction::Sweeper;
use crate::key::{KeyRef, Parts, StateKey};
use crate::spill::Spills;

/// A state and the limits it was made for.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) state: ResourceState,
}

impl Entry {
    /// The state, made for `spec` (`shared` gives the allocation to keep);
    /// one of another number of buckets is adopted (`state::adopt`).
    fn current(
        &mut self,
        spec: &LimitSpec,
        shared: impl FnOnce() -> Arc<LimitSpec>,
        now: Micros,
    ) -> &mut ResourceState {
        if !std::ptr::eq(Arc::as_ptr(&self.spec), spec) && *self.spec != *spec {
            if self.spec.buckets.len() != spec.buckets.len() {
                let old = std::mem::replace(&mut self.state, ResourceState::fresh(spec, now));
                self.state = state::adopt(old, spec, now);
            }
            self.spec = shared();
        }
        &mut self.state
    }

    /// When the state was last taken from (its buckets' latest `ts`).
    pub(crate) fn last_used(&self) -> Micros {
        self.state.buckets.iter().map(|b| b.ts).max().unwrap_or(0)
    }
}

/// The states of a store, its clock and what bounds its memory.
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) map: DashMap<StateKey, Mutex<Entry>, foldhash::fast::RandomState>,
    pub(crate) sweeper: Sweeper,
    pub(crate) spills: Spills,
    /// Registered resources (whose own state is kept), with how many registrations.
    pub(crate) registered: Mutex<HashMap<Arc<str>, usize>>,
    /// The spec of the last keyed call, so a resource's states share one copy.
    last_spec: Mutex<Option<Arc<LimitSpec>>>,
}

impl Store {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            map: DashMap::default(),
            sweeper: Sweeper::default(),
            spills: Spills::default(),
            registered: Mutex::default(),
            last_spec: Mutex::default(),
        }
    }

    /// The map's hash of `key` (random per map; places a folded state).
    pub(crate) fn hash(&self, key: KeyRef<'_>) -> u64 {
        self.map.hasher().hash_one(&key as &dyn Parts)
    }

    /// Runs the reference transition `f` on the state of `key` for `spec`,
    /// making the state from its folded places, else fresh. `local`: the
    /// allocations of the resource part and of `spec` a new state shares.
    pub(crate) fn with_state<R>(
        &self,
        key: KeyRef<'_>,
        spec: &LimitSpec,
        local: Option<(&Arc<str>, &Arc<LimitSpec>)>,
        f: impl FnOnce(&mut ResourceState, Micros) -> R,
    ) -> R {
        let now = self.clock.now();
        // `spec` as a shared allocation: the resource's, else the last one made if equal.
        let shared = || match local {
            Some((_, s)) => s.clone(),
            None => match &mut *self.last_spec.lock() {
                Some(s) if **s == *spec => s.clone(),
                last => last.insert(Arc::new(spec.clone())).clone(),
            },
        };
        let mut inserted = false;
        let result = match self.map.get(&key as &dyn Parts) {
            Some(e) => f(e.lock().current(spec, shared, now), now),
            None => {
                let hash = self.hash(key);
                let owned = key.to_owned_with(local.map(|(r, _)| r));
                let mut e = self.map.entry(owned).or_insert_with(|| {
                    inserted = true;
                    let restored = self.spills.restore(hash, spec, now);
                    let state = restored.unwrap_or_else(|| ResourceState::fresh(spec, now));
                    Mutex::new(Entry {
                        spec: shared(),
                        state,
                    })
                });
                f(e.get_mut().current(spec, shared, now), now)
            }
        };
        self.sweeper.after_write(self, now, inserted);
        result
    }

    /// Frees the slot held under `lease` on the state of `key`.
    pub(crate) fn release(&self, key: KeyRef<'_>, lease: LeaseId) -> bool {
        (self.map.get(&key as &dyn Parts))
            .is_some_and(|e| state::release(&mut e.lock().state, lease))
    }
}

/// A new lease id, unique in the process (never 0).
pub(crate) fn next_lease() -> LeaseId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A lease id for a `try` under `spec` (0 without a concurrency limit).
pub(crate) fn lease_for(spec: &LimitSpec) -> LeaseId {
    spec.max_concurrent.map_or(0, |_| next_lease())
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
