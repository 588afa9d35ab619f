//! [`States`]: the states by key in a [`DashMap`], each behind its own mutex.
//! Keys carry user data (tenant ids): the map's hash is seeded at random.

use std::sync::Arc;

use broker_core::state::{self, LimitSpec, ResourceState};
use broker_core::Micros;
use dashmap::mapref::entry::Entry as MapEntry;
use dashmap::mapref::one::Ref;
use dashmap::DashMap;
use parking_lot::Mutex;

use crate::key::{KeyRef, Parts, StateKey};

/// A state and the limits it was made for.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The limits the state was made for.
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) state: ResourceState,
}

impl Entry {
    pub(crate) fn new(shared: Arc<LimitSpec>, spec: &LimitSpec, now: Micros) -> Self {
        let state = ResourceState::fresh(spec, now);
        Self {
            spec: shared,
            state,
        }
    }

    /// The state, made for `spec` (`shared` gives the allocation to keep);
    /// one of another number of buckets is adopted (`state::adopt`).
    pub(crate) fn current(
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

    /// Whether the state holds a live slot or penalty: what a fold would lose.
    pub(crate) fn holds_slot_or_penalty(&self, now: Micros) -> bool {
        self.state.penalty > now || self.state.leases.iter().any(|l| l.expires > now)
    }

    pub(crate) fn is_idle(&self, now: Micros) -> bool {
        state::is_idle(&self.state, &self.spec, now)
    }
}

type Hasher = foldhash::fast::RandomState;

/// The states by key.
#[derive(Debug)]
pub(crate) struct States {
    map: DashMap<StateKey, Mutex<Entry>, Hasher>,
}

impl States {
    pub(crate) fn new() -> Self {
        Self {
            map: DashMap::with_hasher(Hasher::default()),
        }
    }

    /// The map's hash of `key` (random per map; places a folded state).
    pub(crate) fn hash(&self, key: KeyRef<'_>) -> u64 {
        use std::hash::BuildHasher;
        self.map.hasher().hash_one(&key as &dyn Parts)
    }

    /// The entry of `key`, under its shard's read lock.
    pub(crate) fn get(&self, key: KeyRef<'_>) -> Option<Ref<'_, StateKey, Mutex<Entry>>> {
        self.map.get(&key as &dyn Parts)
    }

    /// Runs `f` on the entry of `key` under its shard's write lock, first
    /// inserting `make(hash)` under `owned()` if none; true when it inserted.
    pub(crate) fn upsert<R>(
        &self,
        key: KeyRef<'_>,
        owned: impl FnOnce() -> StateKey,
        make: impl FnOnce(u64) -> Entry,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> (R, bool) {
        let hash = self.hash(key);
        match self.map.entry(owned()) {
            MapEntry::Occupied(mut e) => (f(e.get_mut().get_mut()), false),
            MapEntry::Vacant(e) => {
                let mut e = e.insert(Mutex::new(make(hash)));
                (f(e.value_mut().get_mut()), true)
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn for_each(&self, mut f: impl FnMut(&StateKey, &Entry)) {
        for e in self.map.iter() {
            f(e.key(), &e.value().lock());
        }
    }

    /// Keeps the entries `keep` says to; gives room back once most is free.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&StateKey, &mut Entry) -> bool) {
        self.map.retain(|k, e| keep(k, e.get_mut()));
        let (len, capacity) = (self.map.len(), self.map.capacity());
        if capacity > 4096 && len < capacity / 4 {
            self.map.shrink_to_fit();
        }
    }
}
