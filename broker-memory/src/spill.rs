//! The places a bounded store folds states into (a key's own, else one of
//! [`SHARED`]), merged so a key never comes back with more than it had.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use broker_core::bucket::{self, BucketParams, BucketState};
use broker_core::state::{self, LimitSpec, ResourceState};
use broker_core::Micros;
use parking_lot::Mutex;

use crate::eviction::RECENT;

/// Fewest and most own places a store holds.
const MIN_PLACES: usize = 1 << 10;
const MAX_PLACES: usize = 1 << 20;
/// Places shared by the keys past the budget.
const SHARED: usize = 4096;

/// The states of one number of buckets folded into a place.
#[derive(Debug)]
struct Held {
    /// The limits the tight states were merged under; once other limits fold
    /// in, the largest burst and slowest refill of each bucket.
    spec: Arc<LimitSpec>,
    /// The tight states, then the raw ones.
    states: Box<[BucketState]>,
    /// The latest time a state was folded in.
    last: Micros,
}

impl Held {
    fn split(&self) -> (&[BucketState], &[BucketState]) {
        self.states.split_at(self.spec.buckets.len())
    }
}

/// The limits of `spec`, bucket by bucket.
fn params_of(spec: &LimitSpec) -> impl Iterator<Item = &BucketParams> {
    spec.buckets.iter().map(|(_, p)| p)
}

/// Per bucket, the largest burst and the slowest refill of `a` and `b`.
fn slowest(a: &LimitSpec, b: &LimitSpec) -> LimitSpec {
    let mut a = a.clone();
    for ((_, a), b) in a.buckets.iter_mut().zip(params_of(b)) {
        let slow = if b.tokens_per_micro() < a.tokens_per_micro() {
            *b
        } else {
            *a
        };
        *a = BucketParams::new(a.capacity().max(b.capacity()), slow.amount(), slow.period());
    }
    a
}

/// The places folded into: own ones by table hash, and the [`SHARED`] ones
/// (made with the first fold past the budget) by hash modulo their number.
#[derive(Debug, Default)]
struct Places {
    own: HashMap<u64, Vec<Held>, foldhash::fast::RandomState>,
    shared: Vec<Vec<Held>>,
}

/// The places of a store.
#[derive(Debug, Default)]
pub(crate) struct Spills {
    places: Mutex<Places>,
    /// Whether anything is folded: until then a new state looks nowhere.
    any: AtomicBool,
    /// States folded so far.
    pub(crate) folded: AtomicU64,
}

impl Spills {
    /// Folds `state` (made for `spec`, of the key with table hash `hash`)
    /// into its own place, made if a store bounded at `max` states has room
    /// for one more, else its shared one.
    pub(crate) fn fold(
        &self,
        hash: u64,
        state: &ResourceState,
        spec: &Arc<LimitSpec>,
        now: Micros,
        max: usize,
    ) {
        let (n, kept) = (spec.buckets.len(), &state.buckets);
        if n == 0 || kept.len() != n {
            // No rate limit: a foldable state holds nothing worth keeping.
            return;
        }
        let budget = max.next_power_of_two().clamp(MIN_PLACES, MAX_PLACES);
        let mut places = self.places.lock();
        let place = if places.own.len() < budget || places.own.contains_key(&hash) {
            places.own.entry(hash).or_default()
        } else {
            places.shared.resize_with(SHARED, Vec::new);
            &mut places.shared[hash as usize % SHARED]
        };
        match place.iter_mut().find(|h| h.spec.buckets.len() == n) {
            None => {
                place.reserve_exact(1);
                place.push(Held {
                    spec: spec.clone(),
                    states: kept.iter().chain(kept).copied().collect(),
                    last: now,
                });
            }
            Some(h) => {
                let (tight, raw) = h.states.split_at_mut(n);
                for (raw, kept) in raw.iter_mut().zip(kept) {
                    *raw = bucket::fewest(*raw, *kept);
                }
                if params_of(spec).eq(params_of(&h.spec)) {
                    for ((tight, kept), p) in tight.iter_mut().zip(kept).zip(params_of(&h.spec)) {
                        *tight = bucket::tighter(*tight, *kept, p);
                    }
                } else {
                    h.spec = Arc::new(slowest(&h.spec, spec));
                    tight.copy_from_slice(raw);
                }
                h.last = h.last.max(now);
            }
        }
        self.any.store(true, Ordering::Release);
        drop(places);
        self.folded.fetch_add(1, Ordering::Relaxed);
    }

    /// Empties the places that have all refilled by `now` and were not
    /// folded into within [`RECENT`].
    pub(crate) fn drop_idle(&self, now: Micros) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut places = self.places.lock();
        let Places { own, shared } = &mut *places;
        let keep = |place: &mut Vec<Held>| {
            // Emptied once nothing was folded in within `RECENT` and every
            // tight state refilled under its limits.
            place.retain(|h| {
                now.saturating_sub(h.last) < RECENT
                    || !(h.split().0.iter().zip(params_of(&h.spec)))
                        .all(|(b, p)| bucket::is_idle(b, p, now))
            });
            place.shrink_to_fit();
            !place.is_empty()
        };
        own.retain(|_, place| keep(place));
        if own.len() < own.capacity() / 4 {
            own.shrink_to_fit();
        }
        if shared.iter_mut().map(keep).filter(|&kept| kept).count() == 0 {
            *shared = Vec::new();
        }
        // The lock held: nothing is folded meanwhile.
        if own.is_empty() && shared.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }

    /// The state a new key starts from: its own place, else its shared one, read under
    /// `spec` (other bucket counts give only their penalty); `None` when that is idle.
    pub(crate) fn restore(
        &self,
        hash: u64,
        spec: &LimitSpec,
        now: Micros,
    ) -> Option<ResourceState> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut restored = ResourceState::fresh(spec, now);
        let places = self.places.lock();
        let place =
            (places.own.get(&hash)).or_else(|| places.shared.get(hash as usize % SHARED))?;
        let mut penalty_end: Micros = 0;
        for h in place {
            let (tight, raw) = h.split();
            if h.spec.buckets.len() != spec.buckets.len() {
                penalty_end = penalty_end.max(state::latest_not_before(raw));
                continue;
            }
            let folded = if params_of(spec).eq(params_of(&h.spec)) {
                tight
            } else {
                raw
            };
            for ((b, kept), p) in restored.buckets.iter_mut().zip(folded).zip(params_of(spec)) {
                *b = bucket::tighter(*b, *kept, p);
            }
        }
        drop(places);
        if penalty_end > now {
            state::penalize_until(&mut restored, spec, now, penalty_end);
        }
        (!state::is_idle(&restored, spec, now)).then_some(restored)
    }
}

#[cfg(test)]
mod tests;
