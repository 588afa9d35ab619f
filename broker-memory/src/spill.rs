//! What a bounded store keeps of the states it drops while they still
//! count. A store holds at most [`crate::MemoryBackend::max_states`]
//! states; past that, the states least recently taken from that are not
//! idle (and hold no slot and are not kept by a registration) are dropped, and each is
//! folded into the set of places kept for its resource part and its exact
//! limits. A set's places come in groups of [`WAYS`]; the table's random
//! hash of a key picks its group. A key folded into a group keeps a place
//! of its own there, marked with its hash, while one is free (never taken,
//! or refilled and not folded into within [`RECENT`]); once all are taken,
//! the keys folded into the group share the group's own state. A state
//! made later for a key starts from its own place if it has one, else
//! from its group's state, so a dropped key never comes back with more
//! than the table kept for it (no limit is multiplied by dropping it). A
//! key with a place of its own comes back with what it had (refilled;
//! two keys of one 64-bit hash share it); one without may come back with
//! less, when keys that share its group's state had used more, until that
//! state refills.
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
//! What a key without a place of its own may lose so is what the keys
//! folded into its group's state took while it refills: a new key made
//! from it takes it on, so the keys that pass through one group within
//! its refill time add up. The first keys folded into a group (those
//! least recently taken from when the store first reaches its bound, such
//! as tenants that were light before a flood of new ids) keep their own
//! places; a flood heavy enough to take every place drains the groups'
//! states, and new keys, and keys folded after it, are then denied rather
//! than let through. All place sets of a store share a budget of as many
//! places as the bound; a set takes half of what is left (the first half
//! the budget), so few sets (a store's keyed resources) get many places.
//! Keys in use stay held (the least recently taken from are dropped
//! first).
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

/// Places shared by every resource.
const SHARED: usize = 4096;
/// Fewest places a set holds.
const MIN_PLACES: usize = 64;
/// Places in a group: the keys a group keeps apart.
const WAYS: usize = 8;
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
    /// Per place: the mark of the key it holds ([`mark`]), 0 for none.
    marks: Box<[u64]>,
    /// Per place: the latest time a state was folded into it.
    lasts: Box<[Micros]>,
    /// `places × buckets` states, merged under the set's limits.
    tight: Box<[BucketState]>,
    /// `places × buckets` states, merged without refilling.
    raw: Box<[BucketState]>,
    /// `groups × buckets` states of the keys that found no place of their
    /// own in their group, merged under the set's limits.
    over_tight: Box<[BucketState]>,
    /// The same, merged without refilling.
    over_raw: Box<[BucketState]>,
    /// The number of groups (a power of two), less one.
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

/// A key's mark in its group: its table hash, never 0 (the group's index
/// is in the low bits, the same for every key of the group).
fn mark(hash: u64) -> u64 {
    hash | 1
}

/// Where a key's state is kept in a set: its own place, or its group's.
#[derive(Clone, Copy)]
enum At {
    Own(usize),
    Group(usize),
}

impl Table {
    fn new(places: usize, buckets: usize) -> Self {
        let groups = places / WAYS;
        Self {
            marks: vec![0; places].into_boxed_slice(),
            lasts: vec![0; places].into_boxed_slice(),
            tight: vec![EMPTY; places * buckets].into_boxed_slice(),
            raw: vec![EMPTY; places * buckets].into_boxed_slice(),
            over_tight: vec![EMPTY; groups * buckets].into_boxed_slice(),
            over_raw: vec![EMPTY; groups * buckets].into_boxed_slice(),
            mask: groups - 1,
            last: 0,
            retired: false,
        }
    }

    fn places(&self) -> usize {
        self.marks.len()
    }

    /// The places of the group of `hash`.
    fn group(&self, hash: u64) -> std::ops::Range<usize> {
        let at = (hash as usize & self.mask) * WAYS;
        at..at + WAYS
    }

    /// Where the state of the key with table hash `hash` is read.
    fn find(&self, hash: u64) -> At {
        let group = self.group(hash);
        match group.clone().find(|&i| self.marks[i] == mark(hash)) {
            Some(i) => At::Own(i),
            None => At::Group(group.start / WAYS),
        }
    }

    /// Where the key with table hash `hash` (made for `params`) is folded at
    /// `now`: its own place, else a free one taken for it (none held, or
    /// refilled and not folded into within [`RECENT`]), else the group's.
    fn place_for(&mut self, hash: u64, params: &[BucketParams], now: Micros) -> At {
        if let own @ At::Own(_) = self.find(hash) {
            return own;
        }
        let n = params.len();
        let free = self.group(hash).find(|&i| {
            self.marks[i] == 0
                || (now.saturating_sub(self.lasts[i]) >= RECENT
                    && idle(&self.tight[i * n..(i + 1) * n], params, now))
        });
        match free {
            Some(i) => {
                self.marks[i] = mark(hash);
                self.tight[i * n..(i + 1) * n].fill(EMPTY);
                self.raw[i * n..(i + 1) * n].fill(EMPTY);
                At::Own(i)
            }
            None => At::Group(hash as usize & self.mask),
        }
    }

    /// The states kept at `at` for `n` buckets: merged under the set's
    /// limits, and without refilling.
    fn read(&self, at: At, n: usize) -> (&[BucketState], &[BucketState]) {
        match at {
            At::Own(i) => (
                &self.tight[i * n..(i + 1) * n],
                &self.raw[i * n..(i + 1) * n],
            ),
            At::Group(g) => (
                &self.over_tight[g * n..(g + 1) * n],
                &self.over_raw[g * n..(g + 1) * n],
            ),
        }
    }

    /// [`Table::read`], to write.
    fn write(&mut self, at: At, n: usize) -> (&mut [BucketState], &mut [BucketState]) {
        match at {
            At::Own(i) => (
                &mut self.tight[i * n..(i + 1) * n],
                &mut self.raw[i * n..(i + 1) * n],
            ),
            At::Group(g) => (
                &mut self.over_tight[g * n..(g + 1) * n],
                &mut self.over_raw[g * n..(g + 1) * n],
            ),
        }
    }
}

impl Places {
    /// Whether the set may be dropped at `now`: nothing folded in within
    /// [`RECENT`], and every place, refilled to `now` under the set's
    /// limits, equal to a fresh bucket.
    fn spent(&self, table: &Table, now: Micros) -> bool {
        now.saturating_sub(table.last) >= RECENT
            && (table.tight.chunks_exact(self.params.len()))
                .chain(table.over_tight.chunks_exact(self.params.len()))
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
    /// at most: as many as the bound (16 bytes and 54 a bucket each, its
    /// share of its group's state included), within
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
            table: Mutex::new(Table::new(size, params.len())),
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
            let at = table.place_for(hash, &params, now);
            let (tight, raw) = table.write(at, n);
            merge(tight, &state.buckets, &params);
            merge_raw(raw, &state.buckets);
            if let At::Own(i) = at {
                table.lasts[i] = table.lasts[i].max(now);
            }
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
    pub(crate) fn restore(
        &self,
        resource: &str,
        hash: u64,
        spec: &LimitSpec,
        now: Micros,
    ) -> Option<ResourceState> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
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
            let (tight, raw) = table.read(table.find(hash), m);
            if m != n {
                held_until = held_until.max(state::latest_not_before(raw));
                continue;
            }
            let same = params_of(spec).eq(places.params.iter());
            narrow(&mut buckets, if same { tight } else { raw }, spec);
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
        Some(restored)
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

    /// A group keeps its first keys apart, each in a place of its own; the
    /// keys folded once those are taken share the group's state, which new
    /// keys start from, and none comes back with more than it had.
    #[test]
    fn a_group_keeps_its_first_keys_apart_and_the_rest_together() {
        use broker_core::{Limits, RateLimit};
        let spec = LimitSpec::new(
            &Limits::new().rate(RateLimit::per_minute(10)),
            std::time::Duration::from_secs(60),
        );
        let now: Micros = 1_000_000;
        let with = |tokens: f64| ResourceState {
            buckets: vec![BucketState {
                tokens,
                ts: now,
                nb: 0,
            }],
            leases: Vec::new(),
            hold: 0,
        };
        let spills = Spills::new();
        let part: Arc<str> = "tenant".into();
        // 64 places, 8 groups: the keys `3 + 16 * k` share group 3.
        let left = |hash: u64| {
            spills
                .restore("tenant", hash, &spec, now)
                .map_or(10.0, |s| s.buckets[0].tokens)
        };
        let key = |k: u64| 3 + 16 * k;
        for k in 0..WAYS as u64 {
            spills.fold(&part, key(k), &with(k as f64), &spec, now, 128);
        }
        assert_eq!(
            spills.by_resource.read()["tenant"][0].table.lock().places(),
            64
        );
        // Past the group's places: together.
        spills.fold(&part, key(10), &with(7.0), &spec, now, 128);
        spills.fold(&part, key(11), &with(5.0), &spec, now, 128);
        for k in 0..WAYS as u64 {
            assert_eq!(left(key(k)), k as f64, "key {k}: its own place");
        }
        assert_eq!(left(key(10)), 5.0, "no more than it had");
        assert_eq!(left(key(11)), 5.0);
        assert_eq!(left(key(12)), 5.0, "a new key of the group");
        assert_eq!(left(4), 10.0, "another group: fresh");
        // A place whose state has refilled is free again after `RECENT`.
        let later = now + 60_000_000;
        spills.fold(&part, key(12), &with(2.0), &spec, later, 128);
        let table = spills.by_resource.read()["tenant"][0].clone();
        assert!(matches!(table.table.lock().find(key(12)), At::Own(_)));
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
        use broker_core::{Cost, Limits, LocalStore, ManualClock, RateLimit};
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
