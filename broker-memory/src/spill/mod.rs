//! What a bounded store keeps of the states it folds: each goes into a place
//! of its resource part and limits (its own in its group of
//! [`WAYS`](places::WAYS) while one is free, else the group's), kept *tight*
//! under those limits and *raw* for other limits; a new state starts from the
//! tightest of its places. Past the budget, [`SHARED`] raw places take the rest.

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

use merge::{merge, merge_raw, params_of};
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
    /// The places shared by every resource, one entry per number of buckets.
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

    /// How many places the sets of a store bounded at `max` states hold.
    pub(crate) fn budget_for(max: usize) -> usize {
        max.next_power_of_two().clamp(MIN_BUDGET, MAX_BUDGET)
    }

    /// States folded so far.
    pub(crate) fn folded(&self) -> u64 {
        self.folded.load(Ordering::Relaxed)
    }

    /// The set of `resource` for `params`, made (within `budget`, half of
    /// what is left) if there is none; `None` when there is no room.
    fn set_for(
        &self,
        resource: &Arc<str>,
        params: &[BucketParams],
        budget: usize,
    ) -> Option<Arc<Places>> {
        let mut map = self.by_resource.write();
        let sets = map.entry(resource.clone()).or_default();
        if let Some(found) = sets.iter().find(|p| *p.params == *params) {
            return Some(found.clone());
        }
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

    /// Folds `state` (made for `spec`, of the key with table hash `hash`)
    /// into its place, or its shared place when the budget has no room.
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
            // No rate limit: a foldable state holds nothing worth keeping.
            return;
        }
        let params: Vec<BucketParams> = params_of(spec).copied().collect();
        // A set retired between its lookup and its lock is looked up again.
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

    /// Drops the sets and empties the shared places that have all refilled
    /// by `now` and were not folded into within [`RECENT`](crate::eviction::RECENT).
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

    /// The state a new key (table hash `hash`) starts from: the tightest of
    /// its places, or `None` (fresh) when that is idle. Its places of another
    /// number of buckets give it their penalty, as `state::adopt` does.
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
            merge(
                &mut buckets,
                if same { tight } else { raw },
                params_of(spec),
            );
        }
        let shared = self.shared.lock();
        for held in &shared[hash as usize % SHARED] {
            match held.raw.len() == n {
                true => merge(&mut buckets, &held.raw, params_of(spec)),
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
