//! The places shared by every resource, for when the budget has no room.

use std::sync::atomic::Ordering;

use broker_core::bucket::{BucketParams, BucketState};
use broker_core::Micros;

use super::merge::{idle, merge_raw};
use super::Spills;
use crate::eviction::RECENT;

/// Places shared by every resource.
pub(super) const SHARED: usize = 4096;

/// A shared place's states of one number of buckets, merged raw, judged
/// refilled under the largest burst and slowest refill folded in.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) raw: Box<[BucketState]>,
    pub(super) slowest: Box<[BucketParams]>,
    /// The latest time a state was folded in.
    pub(super) last: Micros,
}

impl Held {
    /// Whether the place may be emptied at `now`.
    pub(super) fn spent(&self, now: Micros) -> bool {
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

impl Spills {
    /// [`Spills::fold`] into the shared place of `hash`.
    pub(super) fn fold_shared(
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
}
