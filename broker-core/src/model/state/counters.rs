//! Reading upstream counters: which bucket a counter describes, and
//! narrowing that bucket to it.

use super::{LimitSpec, Micros, ResourceState};
use crate::model::bucket::{self, BucketParams};
use crate::model::observed::{Observed, ObservedLimit};
use crate::model::pacing::MAX_MARGIN;
use crate::model::time::micros;

/// The upstream counter that describes bucket `i` of `spec`, if any. An
/// upstream reports one window per unit; with several buckets of a unit
/// (10 a second and 1,000 a day), it describes one of them: the bucket
/// whose burst is nearest the reported limit, or without a limit the
/// shortest window (ties: the shorter window), of the buckets whose window
/// can last until the counter's reset (see [`can_last_until`]; when none
/// can, of those slowest to fill), and of the buckets whose burst is the
/// reported limit if there are any, whatever the reset; first of all, of
/// the buckets whose period is the counter's window (IETF `w`, or that
/// window paced) if there are any. The others are left alone, so a per-second counter at 0 does
/// not drain the daily budget, a per-minute one reporting a reset of
/// minutes neither, and a daily counter, whose reset is hours away, is not
/// read as the per-second bucket's.
pub fn observed_for<'o>(
    spec: &LimitSpec,
    observed: &'o ObservedLimit,
    i: usize,
) -> Option<&'o Observed> {
    let (unit, _) = spec.buckets.get(i)?;
    let o = observed.of(*unit)?;
    let distance = |p: &BucketParams| match o.limit {
        Some(limit) => (p.capacity() - limit as f64).abs(),
        None => 0.0,
    };
    // A window that is a bucket's period (as a pacing margin stretches
    // it, at most `1 / (1 - MAX_MARGIN)` times) names the bucket first.
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
    // A limit that is a bucket's burst names the bucket: a counter's reset
    // may outlast its window (OpenAI's per-minute counters report resets
    // such as "6m0s"), and a per-minute counter read as the day's would
    // drain the daily budget.
    let names = |p: &BucketParams| o.limit.is_some_and(|l| p.capacity() == l as f64);
    let named = of_unit().any(|(_, (_, p))| names(p));
    let candidates = || of_unit().filter(move |(_, (_, p))| !named || names(p));
    let lasts = |p: &BucketParams| o.reset.is_none_or(|reset| can_last_until(p, reset));
    let longest = candidates()
        .map(|(_, (_, p))| full_after(p))
        .fold(0.0, f64::max);
    // Of the buckets that can last until the reset; when none can, the
    // ones that come nearest (the longest to fill).
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

/// Whether a counter that resets `reset` from now can count the window of
/// a bucket of `params`: the bucket refills from empty to full no faster
/// than half as fast as that, with a second to spare for a reset rounded
/// up to whole seconds. A bucket full again in one second cannot be the
/// window of a counter that resets in five hours.
pub fn can_last_until(params: &BucketParams, reset: std::time::Duration) -> bool {
    micros(reset) as f64 <= 2.0 * full_after(params) + 1e6
}

/// How long a bucket of `params` takes to refill from empty to full, in µs.
fn full_after(params: &BucketParams) -> f64 {
    params.capacity() * params.micros_per_token()
}

/// `reconcile`: narrows each bucket to the upstream counter that describes
/// it (see [`observed_for`]).
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
        let Some(remaining) = o.remaining else {
            continue;
        };
        if remaining as f64 >= p.capacity() {
            continue;
        }
        let reset_at = o.reset.map(|r| now.saturating_add(micros(r)));
        state.buckets[i] = bucket::reconcile(state.buckets[i], p, now, remaining as f64, reset_at);
    }
}
