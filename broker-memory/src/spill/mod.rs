//! What a bounded store keeps of the states it drops while they still
//! count. A store holds at most [`crate::MemoryBackend::max_states`]
//! states; past that, the states least recently taken from that are not
//! idle (and hold no slot and are not kept by a registration) are dropped, and each is
//! folded into the set of places kept for its resource part and its exact
//! limits. A set's places come in groups of [`WAYS`](places::WAYS); the table's random
//! hash of a key picks its group. A key folded into a group keeps a place
//! of its own there, marked with its hash, while one is free (never taken,
//! or refilled and not folded into within [`RECENT`](crate::eviction::RECENT)); once all are taken,
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
//!   limits ([`bucket::tighter`](broker_core::bucket::tighter)), read by a key of those limits;
//! - *raw*: the fewest tokens, the latest refill time and the latest
//!   not-before of the states folded in, merged without refilling
//!   ([`bucket::fewest`](broker_core::bucket::fewest)), read by a key of other limits (a reload, or
//!   keyed calls of several tiers under one resource part): the table
//!   keeps a state's buckets across a reload with as many buckets and
//!   refills them under the new limits, so no refill under the old ones
//!   may be read into it, and the raw form holds none.
//!
//! A new state starts from the tightest of every place its key has under
//! its resource part with as many buckets, and of its shared place; its
//! places of another number of buckets (states folded before a reload to
//! other limits) give it the penalty they carry, their latest not-before,
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
//! under its limits and none was folded into within [`RECENT`](crate::eviction::RECENT) (the
//! table keeps a state that long, idle or not). When the budget has no
//! room for a new set (more resource parts and limits folding at once
//! than the budget's worth of smallest sets), the state goes to one of
//! [`SHARED`] places shared by every resource, in the raw form only, for
//! states of any limits with as many buckets; such a place is judged
//! refilled under the slowest refill and the largest burst of the limits
//! folded into it.

mod merge;
mod places;
mod shared;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use broker_core::bucket::{BucketParams, BucketState};
use broker_core::state::{self, LimitSpec, ResourceState};
use broker_core::Micros;
use parking_lot::{Mutex, RwLock};

use merge::{merge, merge_raw, narrow, params_of};
use places::{At, Places, Table};
use shared::{Held, SHARED};

/// Fewest places a set holds.
const MIN_PLACES: usize = 64;
/// Fewest and most places a store's budget holds.
const MIN_BUDGET: usize = 1 << 10;
const MAX_BUDGET: usize = 1 << 20;

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
        // buckets: the penalty a state folded under other limits was under,
        // kept as `state::adopt` keeps it for a state in the table.
        let mut penalty_end: Micros = 0;
        for places in sets {
            let table = places.table.lock();
            let m = places.params.len();
            let (tight, raw) = table.read(table.find(hash), m);
            if m != n {
                penalty_end = penalty_end.max(state::latest_not_before(raw));
                continue;
            }
            let same = params_of(spec).eq(places.params.iter());
            narrow(&mut buckets, if same { tight } else { raw }, spec);
        }
        let shared = self.shared.lock();
        for held in &shared[hash as usize % SHARED] {
            match held.raw.len() == n {
                true => narrow(&mut buckets, &held.raw, spec),
                false => penalty_end = penalty_end.max(state::latest_not_before(&held.raw)),
            }
        }
        drop(shared);
        let mut restored = ResourceState {
            buckets,
            leases: Vec::new(),
            penalty: 0,
        };
        if penalty_end > now {
            state::penalize_until(&mut restored, spec, now, penalty_end);
        }
        if state::is_idle(&restored, spec, now) {
            return None;
        }
        Some(restored)
    }
}
