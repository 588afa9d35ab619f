//! What a bounded store keeps of the states it drops while they still
//! count. A store holds at most [`crate::MemoryBackend::max_states`]
//! states; past that, the least recently used states that are not idle
//! (and hold no slot and are not pinned) are dropped, and each is folded
//! into one of a fixed number of places of its resource, picked by the
//! table's random hash of its key. A place keeps, bucket by bucket, the
//! tightest of the states folded into it ([`bucket::tighter`]); a state
//! made later for any key of that place starts from it. So a dropped key
//! never comes back with more than it had (no limit is multiplied by
//! dropping it); it may come back with less, when a key it shares the
//! place with had used more, until the place refills. A place that has
//! refilled equals a fresh bucket, so places need no cleanup.
//!
//! What a key may lose so is what the keys folded into its place took
//! while the place refills: a new key made from a place takes on its
//! place's state, so the keys that pass through one place within its
//! refill time add up. With as many places as the bound, a flood that
//! sends each place well under a burst's worth of new keys per refill of
//! that burst (at 5 a minute, well under 5 × the bound new keys a minute)
//! seldom denies a new key; a heavier flood of new keys is denied rather
//! than let through. Keys in use stay held (the least recently used are
//! dropped first), so they are not touched. Memory stays at the bound
//! plus the places of the resources that fold states.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use broker_core::bucket::{self, BucketState};
use broker_core::state::{LimitSpec, ResourceState};
use broker_core::Micros;
use parking_lot::{Mutex, RwLock};

use crate::cell::BucketCell;
use crate::{one_bucket, Stored};

/// Fewest and most places per resource.
const MIN_PLACES: usize = 1 << 10;
const MAX_PLACES: usize = 1 << 20;

/// A place nothing was folded into: under [`bucket::refill`] it is a full
/// bucket, and [`bucket::tighter`] with it keeps the other state.
const EMPTY: BucketState = BucketState {
    tokens: f64::INFINITY,
    ts: 0,
    nb: 0,
};

/// The places of every resource that has folded a state.
#[derive(Debug)]
pub(crate) struct Spills {
    by_resource: RwLock<HashMap<Arc<str>, Arc<Places>>>,
    /// Whether any state was folded: until then a new state looks nowhere.
    any: AtomicBool,
    /// States folded so far.
    folded: AtomicU64,
}

/// One resource's places: `buckets` states per place, for a spec of that
/// many buckets.
#[derive(Debug)]
struct Places {
    buckets: usize,
    mask: usize,
    states: Mutex<Box<[BucketState]>>,
}

impl Places {
    fn new(places: usize, buckets: usize) -> Self {
        Self {
            buckets,
            mask: places - 1,
            states: Mutex::new(vec![EMPTY; places * buckets].into_boxed_slice()),
        }
    }

    fn range(&self, hash: u64) -> std::ops::Range<usize> {
        let at = (hash as usize & self.mask) * self.buckets;
        at..at + self.buckets
    }
}

impl Spills {
    pub(crate) fn new() -> Self {
        Self {
            by_resource: RwLock::new(HashMap::new()),
            any: AtomicBool::new(false),
            folded: AtomicU64::new(0),
        }
    }

    /// How many places a resource gets in a store bounded at `max` states:
    /// as many as the bound (24 bytes a bucket each, against the 100 and
    /// more of a state held), so that the keys folded while the bound's
    /// worth of newer keys is held seldom share one.
    pub(crate) fn places_for(max: usize) -> usize {
        max.next_power_of_two().clamp(MIN_PLACES, MAX_PLACES)
    }

    /// States folded so far.
    pub(crate) fn folded(&self) -> u64 {
        self.folded.load(Ordering::Relaxed)
    }

    /// Folds `state` (made for `spec`, of the key with table hash `hash`
    /// under `resource`) into its place; a resource gets `places` places
    /// when it folds its first state.
    pub(crate) fn fold(
        &self,
        resource: &Arc<str>,
        hash: u64,
        state: &ResourceState,
        spec: &LimitSpec,
        places: usize,
    ) {
        let n = spec.buckets.len();
        if n == 0 || state.buckets.len() != n {
            return;
        }
        let existing = self.by_resource.read().get(resource).cloned();
        let target = match existing {
            Some(p) if p.buckets == n => p,
            // A resource registered again with another number of buckets
            // starts its states with full buckets (as the table does).
            _ => {
                let fresh = Arc::new(Places::new(places, n));
                self.by_resource
                    .write()
                    .insert(resource.clone(), fresh.clone());
                fresh
            }
        };
        let mut states = target.states.lock();
        let at = target.range(hash);
        for ((place, kept), (_, p)) in states[at].iter_mut().zip(&state.buckets).zip(&spec.buckets)
        {
            *place = bucket::tighter(*place, *kept, p);
        }
        drop(states);
        self.folded.fetch_add(1, Ordering::Relaxed);
        self.any.store(true, Ordering::Release);
    }

    /// The state a new key (table hash `hash`, under `resource`) starts
    /// from, made for `spec`: its place's, unless nothing is folded there
    /// or the place has refilled by `now` (then a fresh one, `None`).
    #[inline]
    pub(crate) fn restore(
        &self,
        resource: &str,
        hash: u64,
        spec: &LimitSpec,
        now: Micros,
    ) -> Option<Stored> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.restore_folded(resource, hash, spec, now)
    }

    #[cold]
    #[inline(never)]
    fn restore_folded(
        &self,
        resource: &str,
        hash: u64,
        spec: &LimitSpec,
        now: Micros,
    ) -> Option<Stored> {
        let places = self.by_resource.read().get(resource).cloned()?;
        if places.buckets != spec.buckets.len() {
            return None;
        }
        let buckets: Vec<BucketState> = places.states.lock()[places.range(hash)].to_vec();
        let held = buckets
            .iter()
            .zip(&spec.buckets)
            .any(|(b, (_, p))| !bucket::is_idle(b, p, now));
        if !held {
            return None;
        }
        let buckets: Vec<BucketState> = buckets
            .iter()
            .zip(&spec.buckets)
            .map(|(b, (_, p))| bucket::refill(*b, p, now))
            .collect();
        Some(match buckets.as_slice() {
            [b] if one_bucket(spec) => Stored::One(BucketCell::new(*b)),
            _ => Stored::full(ResourceState {
                buckets,
                leases: Vec::new(),
            }),
        })
    }
}
