//! Reading upstream counters into the bucket each describes.

use super::{LimitSpec, Micros, ResourceState};
use crate::model::bucket::{self, BucketParams};
use crate::model::observed::{Observed, ObservedLimit};
use crate::model::resource_config::MAX_MARGIN;
use crate::model::time::micros;

/// The upstream counter that describes bucket `i` of `spec`, if any: of its unit's buckets,
/// narrowed in turn by window = period, limit = burst and lasting until its reset (else the
/// slowest to fill), the one whose burst is nearest its limit, then the shortest period.
pub fn observed_for<'o>(
    spec: &LimitSpec,
    observed: &'o ObservedLimit,
    i: usize,
) -> Option<&'o Observed> {
    let (unit, _) = spec.buckets.get(i)?;
    let o = observed.of(*unit)?;
    let distance = |p: &BucketParams| o.limit.map_or(0.0, |l| (p.capacity() - l as f64).abs());
    // A window that is a bucket's period, maybe paced, names it first.
    let spans = |p: &BucketParams| {
        o.window.is_some_and(|w| {
            let w = micros(w) as f64;
            (w..=w / (1.0 - MAX_MARGIN) + 1.0).contains(&p.period())
        })
    };
    let spanned = spec.buckets.iter().any(|(u, p)| u == unit && spans(p));
    let of_unit = || {
        spec.buckets
            .iter()
            .enumerate()
            .filter(move |(_, (u, p))| u == unit && (!spanned || spans(p)))
    };
    let names = |p: &BucketParams| o.limit.is_some_and(|l| p.capacity() == l as f64);
    let named = of_unit().any(|(_, (_, p))| names(p));
    let candidates = || of_unit().filter(move |(_, (_, p))| !named || names(p));
    // A counter can count a bucket's window if it resets within twice its time to fill, plus 1 s.
    let lasts = |p: &BucketParams| {
        o.reset
            .is_none_or(|r| micros(r) as f64 <= 2.0 * full_after(p) + 1e6)
    };
    let longest = candidates()
        .map(|(_, (_, p))| full_after(p))
        .fold(0.0, f64::max);
    let some_lasts = candidates().any(|(_, (_, p))| lasts(p));
    let described = candidates()
        .filter(|(_, (_, p))| match some_lasts {
            true => lasts(p),
            false => full_after(p) >= longest,
        })
        .min_by(|(_, (_, a)), (_, (_, b))| {
            distance(a)
                .total_cmp(&distance(b))
                .then(a.period().total_cmp(&b.period()))
        })
        .map(|(j, _)| j);
    (described == Some(i)).then_some(o)
}

/// How long a bucket of `params` takes to refill from empty to full, in µs.
fn full_after(params: &BucketParams) -> f64 {
    params.capacity() * params.micros_per_token()
}

/// Narrows each bucket to the counter that describes it ([`observed_for`]).
pub fn reconcile(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    observed: &ObservedLimit,
) {
    for (i, (_, p)) in spec.buckets.iter().enumerate() {
        let Some(o) = observed_for(spec, observed, i) else {
            continue;
        };
        let Some(remaining) = o.remaining.filter(|r| (*r as f64) < p.capacity()) else {
            continue;
        };
        let reset_at = o.reset.map(|r| now.saturating_add(micros(r)));
        state.buckets[i] = bucket::reconcile(state.buckets[i], p, now, remaining as f64, reset_at);
    }
}
