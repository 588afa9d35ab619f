//! What a bounded store keeps of the states it drops while they still
//! count. A store holds at most [`crate::MemoryBackend::max_states`]
//! states; past that, the states least recently taken from that are not
//! idle (and hold no slot and are not pinned) are dropped, and each is
//! folded into a place: one of the places kept for its resource part and
//! its exact limits, picked by the table's random hash of its key. A
//! state made later for a key starts from its places, so a dropped key
//! never comes back with more than the table would have kept for it (no
//! limit is multiplied by dropping it); it may come back with less, when
//! a key it shares a place with had used more, until the place refills.
//!
//! A place keeps each bucket twice:
//! - *tight*: the tightest of the states folded in, under the set's own
//!   limits ([`bucket::tighter`]), read by a key of those limits;
//! - *raw*: the fewest tokens, the latest refill time and the latest
//!   not-before of the states folded in, merged without refilling
//!   ([`bucket::fewest`]), read by a key of other limits (a reload, or
//!   keyed calls of several tiers under one resource part): the table
//!   keeps a state's buckets across a reload with as many buckets and
//!   refills them under the new limits, so no refill under the old ones
//!   may be read into it, and the raw form holds none.
//!
//! A new state starts from the tightest of every place its key has under
//! its resource part with as many buckets, and of its shared place; its
//! places of another number of buckets (states folded before a reload to
//! other limits) give it the penalty they hold, their latest not-before,
//! as a state kept in the table keeps it across such a reload
//! (`state::adopt`).
//!
//! What a key may lose so is what the keys folded into its place took
//! while the place refills: a new key made from a place takes on its
//! place's state, so the keys that pass through one place within its
//! refill time add up. All place sets of a store share a budget of as
//! many places as the bound; a set takes half of what is left (the first
//! half the budget), so few sets (a store's keyed resources) get many
//! places. A flood that sends each place well under a burst's worth of
//! new keys per refill of that burst (at 5 a minute and half the bound's
//! worth of places, well under 2.5 × the bound new keys a minute) seldom
//! denies a new key; a heavier flood of new keys is denied rather than
//! let through. Keys in use stay held (the least recently taken from are
//! dropped first).
//!
//! A set is dropped by the next sweep after its places have all refilled
//! under its limits and none was folded into within [`RECENT`] (the
//! table keeps a state that long, idle or not). When the budget has no
//! room for a new set (more resource parts and limits folding at once
//! than the budget's worth of smallest sets), the state goes to one of
//! [`SHARED`] places shared by every resource, in the raw form only, for
//! states of any limits with as many buckets; such a place is judged
//! refilled under the slowest refill and the largest burst of the limits
//! folded into it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use broker_core::bucket::{self, BucketParams, BucketState};
use broker_core::state::{self, LimitSpec, ResourceState};
use broker_core::Micros;
use parking_lot::{Mutex, RwLock};

use crate::eviction::RECENT;
use crate::Stored;

/// Places shared by every resource.
const SHARED: usize = 4096;
/// Fewest places a set holds.
const MIN_PLACES: usize = 64;
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

/// The places of a store.
#[derive(Debug)]
pub(crate) struct Spills {
    /// The sets of each resource part, one per set of limits.
    by_resource: RwLock<HashMap<Arc<str>, Vec<Arc<Places>>>>,
    /// The places shared by every resource: in each, one entry per
    /// number of buckets folded in.
    shared: Mutex<Box<[Vec<Held>]>>,
    /// Whether anything is folded: until then a new state looks nowhere.
    any: AtomicBool,
    /// Places held in sets.
    used: AtomicUsize,
    /// States folded so far.
    folded: AtomicU64,
}

/// One resource part's places for states made for `params`.
#[derive(Debug)]
struct Places {
    params: Box<[BucketParams]>,
    table: Mutex<Table>,
}

#[derive(Debug)]
struct Table {
    /// `places × buckets` states, merged under the set's limits.
    tight: Box<[BucketState]>,
    /// `places × buckets` states, merged without refilling.
    raw: Box<[BucketState]>,
    mask: usize,
    /// The latest time a state was folded in.
    last: Micros,
    /// Dropped from the store (all its places had refilled): a fold that
    /// finds it so looks the set up again.
    retired: bool,
}

/// A shared place's states of one number of buckets, merged without
/// refilling, and the limits it is judged refilled under: per bucket, the
/// largest burst and the slowest refill of the limits folded in.
#[derive(Debug)]
struct Held {
    raw: Box<[BucketState]>,
    slowest: Box<[BucketParams]>,
    /// The latest time a state was folded in.
    last: Micros,
}

impl Held {
    /// Whether the place may be emptied at `now`.
    fn spent(&self, now: Micros) -> bool {
        now.saturating_sub(self.last) >= RECENT && idle(&self.raw, &self.slowest, now)
    }
}

/// Per bucket, the largest burst and the slowest refill of `a` and `b`.
fn slowest(a: &mut [BucketParams], b: &[BucketParams]) {
    for (a, b) in a.iter_mut().zip(b) {
        let slow = if b.tokens_per_micro() < a.tokens_per_micro() {
            *b
        } else {
            *a
        };
        *a = BucketParams::new(a.capacity().max(b.capacity()), slow.amount(), slow.period());
    }
}

/// The limits of `spec`, bucket by bucket.
fn params_of(spec: &LimitSpec) -> impl Iterator<Item = &BucketParams> {
    spec.buckets.iter().map(|(_, p)| p)
}

/// Whether `states`, made for `params`, all equal fresh buckets at `now`.
fn idle(states: &[BucketState], params: &[BucketParams], now: Micros) -> bool {
    states
        .iter()
        .zip(params)
        .all(|(b, p)| bucket::is_idle(b, p, now))
}

/// Folds `kept` into `place`, both made for `params`.
fn merge(place: &mut [BucketState], kept: &[BucketState], params: &[BucketParams]) {
    for ((place, kept), p) in place.iter_mut().zip(kept).zip(params) {
        *place = bucket::tighter(*place, *kept, p);
    }
}

/// Folds `kept` into `place` without refilling either (for any limits).
fn merge_raw(place: &mut [BucketState], kept: &[BucketState]) {
    for (place, kept) in place.iter_mut().zip(kept) {
        *place = bucket::fewest(*place, *kept);
    }
}

/// Narrows `into` (made for `spec`, at `now`) to `place`, read under
/// `spec`'s limits as a state kept across a reload is (`tighter` refills
/// it to `now` under them).
fn narrow(into: &mut [BucketState], place: &[BucketState], spec: &LimitSpec) {
    for ((b, read), p) in into.iter_mut().zip(place).zip(params_of(spec)) {
        *b = bucket::tighter(*b, *read, p);
    }
}

impl Table {
    fn places(&self) -> usize {
        self.mask + 1
    }

    fn range(&self, hash: u64, buckets: usize) -> std::ops::Range<usize> {
        let at = (hash as usize & self.mask) * buckets;
        at..at + buckets
    }
}

impl Places {
    /// Whether the set may be dropped at `now`: nothing folded in within
    /// [`RECENT`], and every place, refilled to `now` under the set's
    /// limits, equal to a fresh bucket.
    fn spent(&self, table: &Table, now: Micros) -> bool {
        now.saturating_sub(table.last) >= RECENT
            && table
                .tight
                .chunks_exact(self.params.len())
                .all(|place| idle(place, &self.params, now))
    }
}

impl Spills {
    pub(crate) fn new() -> Self {
        Self {
            by_resource: RwLock::new(HashMap::new()),
            shared: Mutex::new((0..SHARED).map(|_| Vec::new()).collect()),
            any: AtomicBool::new(false),
            used: AtomicUsize::new(0),
            folded: AtomicU64::new(0),
        }
    }

    /// How many places the sets of a store bounded at `max` states hold
    /// at most: as many as the bound (48 bytes a bucket each), within
    /// [`MIN_BUDGET`] and [`MAX_BUDGET`].
    pub(crate) fn budget_for(max: usize) -> usize {
        max.next_power_of_two().clamp(MIN_BUDGET, MAX_BUDGET)
    }

    /// States folded so far.
    pub(crate) fn folded(&self) -> u64 {
        self.folded.load(Ordering::Relaxed)
    }

    /// The set of `resource` for states made for `params`, made (within
    /// `budget`) if there is none; `None` when there is no room for it.
    fn set_for(
        &self,
        resource: &Arc<str>,
        params: &[BucketParams],
        budget: usize,
    ) -> Option<Arc<Places>> {
        let find = |sets: &Vec<Arc<Places>>| sets.iter().find(|p| *p.params == *params).cloned();
        if let Some(found) = self.by_resource.read().get(resource).and_then(find) {
            return Some(found);
        }
        let mut map = self.by_resource.write();
        let sets = map.entry(resource.clone()).or_default();
        if let Some(found) = find(sets) {
            return Some(found);
        }
        // Half of what the budget has left, in a power of two (the map's
        // write lock is held: no other set is made or dropped meanwhile).
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
            params: params.into(),
            table: Mutex::new(Table {
                tight: vec![EMPTY; size * params.len()].into_boxed_slice(),
                raw: vec![EMPTY; size * params.len()].into_boxed_slice(),
                mask: size - 1,
                last: 0,
                retired: false,
            }),
        });
        sets.push(made.clone());
        self.any.store(true, Ordering::Release);
        Some(made)
    }

    /// Folds `state` (made for `spec`, of the key with table hash `hash`
    /// under `resource`) into its place, as of `now`; the sets hold at
    /// most `budget` places, and past that the state goes to its shared
    /// place.
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
            // whose slots are all free and whose hold has ended: a state
            // with either is not folded): dropping it loses nothing.
            return;
        }
        let params: Vec<BucketParams> = params_of(spec).copied().collect();
        // A set retired between its lookup and its lock is looked up (and
        // made) again; a retired set is never written.
        loop {
            let Some(places) = self.set_for(resource, &params, budget) else {
                self.fold_shared(hash, &state.buckets, &params, now);
                break;
            };
            let mut table = places.table.lock();
            if table.retired {
                continue;
            }
            let at = table.range(hash, n);
            merge(&mut table.tight[at.clone()], &state.buckets, &params);
            merge_raw(&mut table.raw[at], &state.buckets);
            table.last = table.last.max(now);
            break;
        }
        self.folded.fetch_add(1, Ordering::Relaxed);
    }

    /// [`Spills::fold`] into the shared place of `hash`.
    fn fold_shared(
        &self,
        hash: u64,
        buckets: &[BucketState],
        params: &[BucketParams],
        now: Micros,
    ) {
        let mut shared = self.shared.lock();
        let place = &mut shared[hash as usize % SHARED];
        match place.iter_mut().find(|h| h.raw.len() == buckets.len()) {
            Some(held) => {
                merge_raw(&mut held.raw, buckets);
                slowest(&mut held.slowest, params);
                held.last = held.last.max(now);
            }
            None => place.push(Held {
                raw: buckets.into(),
                slowest: params.into(),
                last: now,
            }),
        }
        self.any.store(true, Ordering::Release);
    }

    /// Drops the sets whose places have all refilled by `now`, and empties
    /// the shared places that have (they equal fresh buckets), giving
    /// their room back to the budget.
    pub(crate) fn drop_idle(&self, now: Micros) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut map = self.by_resource.write();
        map.retain(|_, sets| {
            sets.retain(|places| {
                let mut table = places.table.lock();
                if !places.spent(&table, now) {
                    return true;
                }
                table.retired = true;
                self.used.fetch_sub(table.places(), Ordering::Relaxed);
                false
            });
            !sets.is_empty()
        });
        let mut shared = self.shared.lock();
        for place in shared.iter_mut() {
            place.retain(|held| !held.spent(now));
        }
        // Both locks held: nothing is folded meanwhile.
        if map.is_empty() && shared.iter().all(Vec::is_empty) {
            self.any.store(false, Ordering::Release);
        }
    }

    /// The state a new key (table hash `hash`, under `resource`) starts
    /// from, made for `spec`: the tightest of its places (see the module's
    /// documentation), unless every one is idle by `now` (then a fresh
    /// one, `None`).
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
        let mut buckets: Vec<BucketState> = params_of(spec)
            .map(|p| BucketState::fresh(p, now))
            .collect();
        let sets: Vec<Arc<Places>> = self
            .by_resource
            .read()
            .get(resource)
            .map(|sets| sets.to_vec())
            .unwrap_or_default();
        // The latest not-before of the key's places of another number of
        // buckets: the penalty a state folded under other limits held,
        // kept as `state::adopt` keeps it for a state in the table.
        let mut held_until: Micros = 0;
        for places in sets {
            let table = places.table.lock();
            let m = places.params.len();
            if m != n {
                held_until =
                    held_until.max(state::latest_not_before(&table.raw[table.range(hash, m)]));
                continue;
            }
            let at = table.range(hash, n);
            let same = params_of(spec).eq(places.params.iter());
            let place = if same {
                &table.tight[at]
            } else {
                &table.raw[at]
            };
            narrow(&mut buckets, place, spec);
        }
        let shared = self.shared.lock();
        for held in &shared[hash as usize % SHARED] {
            match held.raw.len() == n {
                true => narrow(&mut buckets, &held.raw, spec),
                false => held_until = held_until.max(state::latest_not_before(&held.raw)),
            }
        }
        drop(shared);
        let mut restored = ResourceState {
            buckets,
            leases: Vec::new(),
            hold: 0,
        };
        if held_until > now {
            state::hold_until(&mut restored, spec, now, held_until);
        }
        if state::is_idle(&restored, spec, now) {
            return None;
        }
        Some(Stored::of(restored, spec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set made and then swept before anything is folded into it (a
    /// sweep racing a fold) is judged by the limits it was made for.
    #[test]
    fn a_set_with_nothing_folded_is_dropped_without_a_panic() {
        let spills = Spills::new();
        let params = [BucketParams::new(5.0, 5.0, 60_000_000.0)];
        assert!(spills.set_for(&"ip-1".into(), &params, 1024).is_some());
        spills.drop_idle(1_000_000);
        assert!(spills.by_resource.read().is_empty());
        assert!(!spills.any.load(Ordering::Relaxed));
    }

    /// New keys made while another thread folds, past the states it
    /// counted, are not let past the bound: an insert an eighth past it
    /// waits for the fold to end and then folds in turn. Here the fold
    /// is held at a place set's lock (taken by the test) after it has
    /// counted the states, while another thread makes 200 new keys;
    /// before, the fold ended with all 200 kept and the next one due only
    /// an eighth past them.
    #[test]
    fn keys_made_during_a_fold_do_not_pass_the_bound() {
        use crate::key::with_parsed;
        use broker_core::{Backend, Cost, Limits, ManualClock, RateLimit};
        use std::time::Duration;

        let clock = ManualClock::new();
        clock.set(1_000_000);
        let backend = crate::MemoryBackend::with_clock(clock.clone()).max_states(64);
        let store = backend.store.clone();
        let spec = LimitSpec::new(
            &Limits::new().rate(RateLimit::per_minute(5)),
            Duration::from_secs(60),
        );
        let shard = |key: &str| with_parsed(key, |k| store.states.shard_index(k));
        // Keys of `part` in shard 0 (`in_zero`) or in any other.
        let keys = |part: &'static str, in_zero: bool, n: usize| {
            (0..)
                .map(move |i| format!("{part}:k{i}"))
                .filter(move |k| (shard(k) == 0) == in_zero)
                .take(n)
                .collect::<Vec<_>>()
        };
        let take = |key: &str| {
            backend
                .try_acquire_now(key, &spec, Cost::default())
                .unwrap()
                .unwrap()
        };
        // 65 keys of `r` in shard 0: the 65th folds 9 of them, which
        // makes `r`'s place set; 8 more bring the store to its bound.
        for key in keys("r", true, 73) {
            assert!(take(&key).allowed);
        }
        assert_eq!(backend.len(), 64);
        let set = store.spills.by_resource.read()["r"][0].clone();
        let held = set.table.lock();
        // One more key (another part, no place set to read): its insert
        // folds, and waits at the set's lock once it has counted the states.
        let s_key = keys("s", true, 1).pop().unwrap();
        let flood = keys("other", false, 200);
        std::thread::scope(|s| {
            let folding = s.spawn(|| take(&s_key));
            while Arc::strong_count(&set) < 3 {
                std::thread::yield_now();
            }
            // Meanwhile, 200 new keys in other shards.
            let inserting = s.spawn(|| {
                flood.iter().for_each(|k| {
                    take(k);
                })
            });
            while !inserting.is_finished() && store.sweeper.waiting.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            drop(held);
            folding.join().unwrap();
            inserting.join().unwrap();
        });
        assert!(backend.len() <= 65, "{} states, bound 64", backend.len());
    }
}
