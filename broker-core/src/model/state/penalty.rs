//! Penalties on a resource: a 429's or a spent counter's penalty, one
//! carried across a reload, and how long a call is still under one.

use super::{costs, LimitSpec, Micros, ResourceState};
use crate::model::bucket::{self, BucketState};
use crate::model::limits::Cost;

/// `penalty_left`: how long, from `now`, a call of `cost` is still under a
/// 429's or a spent counter's penalty (see [`penalize`] and
/// [`reconcile`](super::reconcile)), whatever the tokens: the latest
/// not-before of the buckets the cost draws on, each read from its own
/// time as [`wait_all`](super::wait_all) reads it, or, without rate limits,
/// the time left of the [`ResourceState::penalty`]; 0 for none. Changes
/// nothing. A call booked before the penalty came, asked once its booked
/// time has come, finds the penalty here where the booking did not wait
/// for it.
pub fn penalty_left(state: &ResourceState, spec: &LimitSpec, now: Micros, cost: Cost) -> Micros {
    if spec.buckets.is_empty() {
        return state.penalty.saturating_sub(now);
    }
    costs(spec, cost)
        .zip(&state.buckets)
        .filter(|(c, _)| *c > 0.0)
        .map(|(_, s)| s.nb.saturating_sub(now.max(s.ts)))
        .max()
        .unwrap_or(0)
}

/// `penalize`: drains every bucket and penalizes it until `until`. A
/// resource without rate limits has no bucket to penalize: its
/// [`ResourceState::penalty`] is set to `until` instead (never shortened),
/// so that every user of the store waits it out.
pub fn penalize(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        state.penalty = state.penalty.max(until);
        return;
    }
    for (i, (_, p)) in spec.buckets.iter().enumerate() {
        state.buckets[i] = bucket::penalize(state.buckets[i], p, now, until);
    }
}

/// The end of the penalty `state` is under, whatever limits it was made
/// for: the latest not-before of its buckets (a 429's penalty, or a spent
/// counter's until its reset), or its [`ResourceState::penalty`]; 0 for
/// none. On the state's own clock (see [`bucket::on_bucket_time`]).
pub fn penalty_end(state: &ResourceState) -> Micros {
    latest_not_before(&state.buckets).max(state.penalty)
}

/// The latest not-before of `buckets` (made for any limits); 0 for none.
pub fn latest_not_before(buckets: &[BucketState]) -> Micros {
    buckets.iter().map(|b| b.nb).max().unwrap_or(0)
}

/// `penalize_until`: penalizes `state` (made for `spec`) until `until`, as
/// [`penalize`] does but without draining a bucket: each bucket's
/// not-before moves to `until` (on the bucket's time, see
/// [`bucket::on_bucket_time`]) unless it is later; with no bucket, the
/// [`ResourceState::penalty`] does. Never shortens a penalty.
pub fn penalize_until(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        state.penalty = state.penalty.max(until);
        return;
    }
    for b in &mut state.buckets {
        b.nb = b.nb.max(bucket::on_bucket_time(b, now, until));
    }
}

/// `adopt`: the state of a key made for other limits with another number
/// of rate limits (a reload), taken on under `spec` as of `now`. Its
/// buckets cannot be matched to the new ones, so they start full, as
/// [`ResourceState::fresh`]; its leases stay held, so the concurrency
/// limit still counts them; and the penalty it was under (see
/// [`penalty_end`]) goes on the new state until the same end (see
/// [`penalize_until`]): a reload during an upstream 429's penalty does not
/// let calls through before the upstream said they may come.
///
/// The buckets are penalized, not drained: what `adopt` makes does not depend
/// on when after the reload it runs (a full bucket stays full), so a
/// store that does not write the adopted state back on every call (the
/// Redis scripts write nothing on a denial, and `take_slot` reads no
/// bucket) decides as one that does.
///
/// ```
/// use broker_core::state::{self, LimitSpec, ResourceState};
/// use broker_core::{Limits, RateLimit};
/// use std::time::Duration;
///
/// let ttl = Duration::from_secs(60);
/// let one = LimitSpec::new(&Limits::new().rate(RateLimit::per_second(10)), ttl);
/// let mut s = ResourceState::fresh(&one, 0);
/// state::penalize(&mut s, &one, 0, 3_000_000);
/// let two = LimitSpec::new(
///     &Limits::new().rate(RateLimit::per_second(10)).rate(RateLimit::per_minute(100)),
///     ttl,
/// );
/// let s = state::adopt(s, &two, 1_000_000);
/// assert_eq!(state::wait_all(&s, &two, 1_000_000, broker_core::Cost::default()), 2_000_000);
/// ```
pub fn adopt(old: ResourceState, spec: &LimitSpec, now: Micros) -> ResourceState {
    let until = penalty_end(&old);
    let mut state = ResourceState {
        leases: old.leases,
        ..ResourceState::fresh(spec, now)
    };
    if until > now {
        penalize_until(&mut state, spec, now, until);
    }
    state
}
