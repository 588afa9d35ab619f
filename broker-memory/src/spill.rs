//! What a bounded store keeps of the states it drops while they still
//! count. A store holds at most [`crate::MemoryBackend::max_states`]
//! states; past that, the least recently used states that are not idle
//! (and hold no slot and are not pinned) are dropped, and each is folded
//! into one of the places kept for its resource part and number of
//! buckets, picked by the table's random hash of its key. A place keeps,
//! bucket by bucket, the tightest of the states folded into it
//! ([`bucket::tighter`]); a state made later for any key of that place
//! starts from it. So a dropped key never comes back with more than it
//! had (no limit is multiplied by dropping it); it may come back with
//! less, when a key it shares the place with had used more, until the
//! place refills.
//!
//! What a key may lose so is what the keys folded into its place took
//! while the place refills: a new key made from a place takes on its
//! place's state, so the keys that pass through one place within its
//! refill time add up. All places of a store share a budget of as many
//! as the bound; a resource's set takes half of what is left (the first
//! half the budget), so few sets (a store's keyed resources) get many
//! places. A flood that sends each place well under a burst's worth of
//! new keys per refill of that burst (at 5 a minute and half the bound's
//! worth of places, well under 2.5 × the bound new keys a minute) seldom
//! denies a new key; a heavier flood of new keys is denied rather than
//! let through. Keys in use stay held (the least recently used are
//! dropped first), so they are not touched.
//!
//! A resource's places are dropped by the next sweep after they have all
//! refilled (a refilled place equals a fresh bucket). When the budget
//! has no room for a resource's first places (more resource parts
//! folding at once than the budget's worth of smallest place sets: only
//! keyed calls that make up their resource parts get there; the broker's
//! resource parts are its registered resources), the state is folded into
//! one of [`SHARED`] places shared by every resource, as a time: when its
//! slowest bucket is full again, and its not-before ([`Later`]). That
//! holds for any limits, so states of any resource can share a place;
//! it is coarser (a key made from it starts as if each of its buckets
//! were refilling until that time), which is why it is the last resort.
//! A new key starts from the tighter of its resource's place and its
//! shared place.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use broker_core::bucket::{self, BucketParams, BucketState};
use broker_core::state::{LimitSpec, ResourceState};
use broker_core::Micros;
use parking_lot::{Mutex, RwLock};

use crate::cell::BucketCell;
use crate::{one_bucket, Stored};

/// Fewest places a resource's set holds.
const MIN_PLACES: usize = 64;
/// Places shared by every resource (see [`Later`]).
const SHARED: usize = 4096;
/// Fewest and most places a store's budget holds.
const MIN_BUDGET: usize = 1 << 10;
const MAX_BUDGET: usize = 1 << 20;

/// A place nothing was folded into: under [`bucket::refill`] it is a full
/// bucket, and [`bucket::tighter`] with it keeps the other state.
const EMPTY: BucketState = BucketState {
    tokens: f64::INFINITY,
    ts: 0,
    nb: 0,
};

/// A state folded as a time, for any limits: no bucket is full before
/// `full`, and nothing is handed out before `nb`. Made by
/// [`Later::of`], read back by [`Later::restored`]: a bucket restored
/// from it never holds more than the state it was made of held.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Later {
    full: Micros,
    nb: Micros,
}

impl Later {
    /// When every bucket of `buckets` (made for `params`), refilled to
    /// `now`, is full again ([`bucket::full_again_at`]), and the latest
    /// not-before.
    fn of(buckets: &[BucketState], params: &[BucketParams], now: Micros) -> Self {
        buckets
            .iter()
            .zip(params)
            .fold(Self::default(), |acc, (b, p)| Self {
                full: acc.full.max(bucket::full_again_at(*b, p, now)),
                nb: acc.nb.max(b.nb),
            })
    }

    /// The tighter of two.
    fn max(self, other: Self) -> Self {
        Self {
            full: self.full.max(other.full),
            nb: self.nb.max(other.nb),
        }
    }

    /// Whether it holds nothing back at `now`.
    fn idle(self, now: Micros) -> bool {
        self.full <= now && self.nb <= now
    }

    /// A bucket of `p` at `now` that is full no sooner than `full`.
    fn restored(self, p: &BucketParams, now: Micros) -> BucketState {
        bucket::full_by(self.full, self.nb, p, now)
    }
}

/// The places of a store, by resource part and number of buckets.
#[derive(Debug)]
pub(crate) struct Spills {
    by_resource: RwLock<HashMap<Arc<str>, Vec<Arc<Places>>>>,
    /// The places shared by every resource.
    shared: Mutex<Box<[Later]>>,
    /// Whether any place set exists: until one does, a new state looks
    /// nowhere.
    any: AtomicBool,
    /// Places held, in all sets.
    used: AtomicUsize,
    /// States folded so far.
    folded: AtomicU64,
}

/// One resource part's places for states of `buckets` buckets.
#[derive(Debug)]
struct Places {
    buckets: usize,
    table: Mutex<Table>,
}

#[derive(Debug)]
struct Table {
    /// `places × buckets` states.
    states: Box<[BucketState]>,
    /// The buckets of the last state folded in: a restore reads a place
    /// with the limits of the state it makes, so whether a place has
    /// refilled is told by the latest limits.
    params: Vec<BucketParams>,
    mask: usize,
    /// Dropped from the store (all its places had refilled): a fold that
    /// finds it so looks the set up again.
    retired: bool,
}

impl Table {
    fn places(&self) -> usize {
        self.mask + 1
    }

    fn range(&self, hash: u64, buckets: usize) -> std::ops::Range<usize> {
        let at = (hash as usize & self.mask) * buckets;
        at..at + buckets
    }

    /// Whether every place, refilled to `now`, equals a fresh bucket.
    fn idle(&self, now: Micros) -> bool {
        self.states.chunks_exact(self.params.len()).all(|place| {
            place
                .iter()
                .zip(&self.params)
                .all(|(b, p)| bucket::is_idle(b, p, now))
        })
    }
}

impl Spills {
    pub(crate) fn new() -> Self {
        Self {
            by_resource: RwLock::new(HashMap::new()),
            shared: Mutex::new(vec![Later::default(); SHARED].into_boxed_slice()),
            any: AtomicBool::new(false),
            used: AtomicUsize::new(0),
            folded: AtomicU64::new(0),
        }
    }

    /// How many places all resources of a store bounded at `max` states
    /// hold at most: as many as the bound (24 bytes a bucket each), within
    /// [`MIN_BUDGET`] and [`MAX_BUDGET`].
    pub(crate) fn budget_for(max: usize) -> usize {
        max.next_power_of_two().clamp(MIN_BUDGET, MAX_BUDGET)
    }

    /// States folded so far.
    pub(crate) fn folded(&self) -> u64 {
        self.folded.load(Ordering::Relaxed)
    }

    /// The place set of `resource` for `buckets` buckets, made (within
    /// `budget`) when `make`; `None` when there is none, or no room for it.
    fn places(
        &self,
        resource: &Arc<str>,
        buckets: usize,
        make: bool,
        budget: usize,
    ) -> Option<Arc<Places>> {
        let find = |sets: &Vec<Arc<Places>>| sets.iter().find(|p| p.buckets == buckets).cloned();
        if let Some(found) = self.by_resource.read().get(resource).and_then(find) {
            return Some(found);
        }
        if !make {
            return None;
        }
        let mut map = self.by_resource.write();
        let sets = map.entry(resource.clone()).or_default();
        if let Some(found) = find(sets) {
            return Some(found);
        }
        // Half of what the budget has left, in a power of two (the map's
        // write lock is held: no other set is made meanwhile).
        let left = budget.saturating_sub(self.used.load(Ordering::Relaxed));
        let size = match left / 2 {
            half if half >= MIN_PLACES => 1 << half.ilog2(),
            _ if left >= MIN_PLACES => MIN_PLACES,
            _ => {
                if sets.is_empty() {
                    map.remove(resource);
                }
                return None;
            }
        };
        self.used.fetch_add(size, Ordering::Relaxed);
        let made = Arc::new(Places {
            buckets,
            table: Mutex::new(Table {
                states: vec![EMPTY; size * buckets].into_boxed_slice(),
                params: Vec::new(),
                mask: size - 1,
                retired: false,
            }),
        });
        sets.push(made.clone());
        self.any.store(true, Ordering::Release);
        Some(made)
    }

    /// Folds `state` (made for `spec`, of the key with table hash `hash`
    /// under `resource`) into its place, as of `now`; the store's places
    /// hold at most `budget`; with no room for the resource's places, into
    /// its shared place.
    pub(crate) fn fold(
        &self,
        resource: &Arc<str>,
        hash: u64,
        state: &ResourceState,
        spec: &LimitSpec,
        now: Micros,
        budget: usize,
    ) {
        let n = spec.buckets.len();
        if n == 0 || state.buckets.len() != n {
            // Nothing a rate limit counts (a concurrency limit alone,
            // whose slots are all free): dropping it loses nothing.
            return;
        }
        // A set retired between its lookup and its lock is looked up (and
        // made) again; a retired set is never used.
        loop {
            let Some(places) = self.places(resource, n, true, budget) else {
                let params: Vec<BucketParams> = spec.buckets.iter().map(|(_, p)| *p).collect();
                let later = Later::of(&state.buckets, &params, now);
                let mut shared = self.shared.lock();
                let place = &mut shared[hash as usize % SHARED];
                *place = place.max(later);
                drop(shared);
                self.folded.fetch_add(1, Ordering::Relaxed);
                self.any.store(true, Ordering::Release);
                return;
            };
            let mut table = places.table.lock();
            if table.retired {
                continue;
            }
            table.params.clear();
            table.params.extend(spec.buckets.iter().map(|(_, p)| *p));
            let at = table.range(hash, n);
            for ((place, kept), (_, p)) in table.states[at]
                .iter_mut()
                .zip(&state.buckets)
                .zip(&spec.buckets)
            {
                *place = bucket::tighter(*place, *kept, p);
            }
            drop(table);
            self.folded.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }

    /// Drops the place sets whose places have all refilled by `now` (they
    /// equal fresh buckets), giving their room back to the budget.
    pub(crate) fn drop_idle(&self, now: Micros) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut map = self.by_resource.write();
        map.retain(|_, sets| {
            sets.retain(|places| {
                let mut table = places.table.lock();
                if !table.idle(now) {
                    return true;
                }
                table.retired = true;
                self.used.fetch_sub(table.places(), Ordering::Relaxed);
                false
            });
            !sets.is_empty()
        });
        if map.is_empty() && self.shared.lock().iter().all(|l| l.idle(now)) {
            self.any.store(false, Ordering::Release);
        }
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
        let n = spec.buckets.len();
        let places = self
            .by_resource
            .read()
            .get(resource)
            .and_then(|sets| sets.iter().find(|p| p.buckets == n).cloned());
        let mut buckets: Vec<BucketState> = match places {
            Some(places) => {
                let table = places.table.lock();
                table.states[table.range(hash, n)]
                    .iter()
                    .zip(&spec.buckets)
                    .map(|(b, (_, p))| bucket::refill(*b, p, now))
                    .collect()
            }
            None => spec
                .buckets
                .iter()
                .map(|(_, p)| BucketState::fresh(p, now))
                .collect(),
        };
        let later = self.shared.lock()[hash as usize % SHARED];
        if !later.idle(now) {
            for (b, (_, p)) in buckets.iter_mut().zip(&spec.buckets) {
                *b = bucket::tighter(*b, later.restored(p, now), p);
            }
        }
        let held = buckets
            .iter()
            .zip(&spec.buckets)
            .any(|(b, (_, p))| !bucket::is_idle(b, p, now));
        if !held {
            return None;
        }
        Some(match buckets.as_slice() {
            [b] if one_bucket(spec) => Stored::One(BucketCell::new(*b)),
            _ => Stored::full(ResourceState {
                buckets,
                leases: Vec::new(),
            }),
        })
    }
}
