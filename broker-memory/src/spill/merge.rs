//! The bucket-wise merges of places.

use broker_core::bucket::{self, BucketParams, BucketState};
use broker_core::state::LimitSpec;
use broker_core::Micros;

/// The limits of `spec`, bucket by bucket.
pub(super) fn params_of(spec: &LimitSpec) -> impl Iterator<Item = &BucketParams> {
    spec.buckets.iter().map(|(_, p)| p)
}

/// Whether `states`, made for `params`, all equal fresh buckets at `now`.
pub(super) fn idle(states: &[BucketState], params: &[BucketParams], now: Micros) -> bool {
    states
        .iter()
        .zip(params)
        .all(|(b, p)| bucket::is_idle(b, p, now))
}

/// Folds `kept` into `place`, both made for `params`.
pub(super) fn merge(place: &mut [BucketState], kept: &[BucketState], params: &[BucketParams]) {
    for ((place, kept), p) in place.iter_mut().zip(kept).zip(params) {
        *place = bucket::tighter(*place, *kept, p);
    }
}

/// Folds `kept` into `place` without refilling either (for any limits).
pub(super) fn merge_raw(place: &mut [BucketState], kept: &[BucketState]) {
    for (place, kept) in place.iter_mut().zip(kept) {
        *place = bucket::fewest(*place, *kept);
    }
}

/// Narrows `into` (made for `spec`) to `place`, refilled under `spec`.
pub(super) fn narrow(into: &mut [BucketState], place: &[BucketState], spec: &LimitSpec) {
    for ((b, read), p) in into.iter_mut().zip(place).zip(params_of(spec)) {
        *b = bucket::tighter(*b, *read, p);
    }
}
