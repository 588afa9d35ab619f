//! [`States`]: the states by key, in a [`DashMap`], each behind a mutex
//! of its own, so that decisions on different keys of one shard run at
//! once and those on one key one at a time.
//!
//! Keys carry user data (tenant ids): the map hashes them with foldhash,
//! seeded at random per process and per map.

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
    /// The limits the state was made for (the sweeper needs them to tell
    /// an idle state).
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) state: ResourceState,
}

impl Entry {
    /// A fresh state made for `spec`, which `shared` is an allocation of.
    pub(crate) fn new(shared: Arc<LimitSpec>, spec: &LimitSpec, now: Micros) -> Self {
        Self::with(shared, ResourceState::fresh(spec, now))
    }

    /// `state`, made for `spec`.
    pub(crate) fn with(spec: Arc<LimitSpec>, state: ResourceState) -> Self {
        Self { spec, state }
    }

    /// The state, made for `spec` (`shared` gives the allocation to keep):
    /// a resource re-configured with the same number of buckets keeps its
    /// state; one with other buckets starts with full buckets, and keeps
    /// its held slots and its penalty (`state::adopt`).
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

    /// When the state was last brought up to date (its buckets' latest
    /// `ts`): every decision that takes from it does.
    pub(crate) fn last_used(&self) -> Micros {
        self.state.buckets.iter().map(|b| b.ts).max().unwrap_or(0)
    }

    /// Whether the state holds a slot that has not expired by `now`, or is
    /// under a [`ResourceState::penalty`] that has not ended by then: what a
    /// fold would lose.
    pub(crate) fn holds_slot_or_hold(&self, now: Micros) -> bool {
        self.state.penalty > now || self.state.leases.iter().any(|l| l.expires > now)
    }

    /// [`state::is_idle`].
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

    /// A hash of `key`, random per map, so a client cannot pick keys that
    /// share one (see [`crate::spill`], which places a dropped state by
    /// it).
    pub(crate) fn hash(&self, key: KeyRef<'_>) -> u64 {
        use std::hash::BuildHasher;
        self.map.hasher().hash_one(&key as &dyn Parts)
    }

    /// The index of the shard `key` is held in.
    #[cfg(test)]
    pub(crate) fn shard_index(&self, key: KeyRef<'_>) -> usize {
        self.map.determine_map(&key as &dyn Parts)
    }

    /// The entry of `key`, under its shard's read lock; `None` when there
    /// is none.
    pub(crate) fn get(&self, key: KeyRef<'_>) -> Option<Ref<'_, StateKey, Mutex<Entry>>> {
        self.map.get(&key as &dyn Parts)
    }

    /// Runs `f` on the entry of `key` under its shard's write lock,
    /// inserting `make(hash)` (`hash`: the key's [`States::hash`]) under
    /// the key `owned()` when there is none; true in the second place
    /// when it inserted.
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

    /// Number of entries (each shard counted under its lock in turn).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Runs `f` on every entry, one shard at a time under its read lock.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&StateKey, &Entry)) {
        for e in self.map.iter() {
            f(e.key(), &e.value().lock());
        }
    }

    /// Keeps the entries for which `keep` says so, one shard at a time
    /// under its write lock; gives the room back once most of it is free.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&StateKey, &mut Entry) -> bool) {
        self.map.retain(|k, e| keep(k, e.get_mut()));
        let (len, capacity) = (self.map.len(), self.map.capacity());
        if capacity > 4096 && len < capacity / 4 {
            self.map.shrink_to_fit();
        }
    }
}
