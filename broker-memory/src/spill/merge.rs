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

/// Folds `kept` into `place`, both read under `params` (`tighter` refills
/// them to the later time).
pub(super) fn merge<'p>(
    place: &mut [BucketState],
    kept: &[BucketState],
    params: impl IntoIterator<Item = &'p BucketParams>,
) {
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
