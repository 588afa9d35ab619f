//! Holding a resource: a 429's penalty, a hold carried across a reload,
//! and how long a call is still held.

use super::{costs, LimitSpec, Micros, ResourceState};
use crate::model::bucket::{self, BucketState};
use crate::model::limits::Cost;

/// `hold_left`: how long, from `now`, a call of `cost` is still held by a
/// 429's penalty or a spent counter's hold (see [`penalize`] and
/// [`reconcile`](super::reconcile)), whatever the tokens: the latest not-before of the
/// buckets the cost draws on, each read from its own time as
/// [`wait_all`](super::wait_all) reads it, or, without rate limits, the time left of the
/// [`ResourceState::hold`]; 0 for none. Changes nothing. A call booked
/// before the hold came, asked once its booked time has come, finds the
/// hold here where the booking did not wait for it.
pub fn hold_left(state: &ResourceState, spec: &LimitSpec, now: Micros, cost: Cost) -> Micros {
    if spec.buckets.is_empty() {
        return state.hold.saturating_sub(now);
    }
    costs(spec, cost)
        .zip(&state.buckets)
        .filter(|(c, _)| *c > 0.0)
        .map(|(_, s)| s.nb.saturating_sub(now.max(s.ts)))
        .max()
        .unwrap_or(0)
}

/// `penalize`: drains every bucket and holds it until `until`. A resource
/// without rate limits has no bucket to hold: its
/// [`ResourceState::hold`] is set to `until` instead (never shortened), so
/// that every user of the store waits it out.
pub fn penalize(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        state.hold = state.hold.max(until);
        return;
    }
    for (i, (_, p)) in spec.buckets.iter().enumerate() {
        state.buckets[i] = bucket::penalize(state.buckets[i], p, now, until);
    }
}

/// The end of the penalty `state` is under, whatever limits it was made
/// for: the latest not-before of its buckets (a 429's hold, or a spent
/// counter's until its reset), or its [`ResourceState::hold`]; 0 for
/// none. On the state's own clock (see [`bucket::on_bucket_time`]).
pub fn held_until(state: &ResourceState) -> Micros {
    latest_not_before(&state.buckets).max(state.hold)
}

/// The latest not-before of `buckets` (made for any limits); 0 for none.
pub fn latest_not_before(buckets: &[BucketState]) -> Micros {
    buckets.iter().map(|b| b.nb).max().unwrap_or(0)
}

/// `hold_until`: holds `state` (made for `spec`) until `until`, as
/// [`penalize`] does but without draining a bucket: each bucket's
/// not-before moves to `until` (on the bucket's time, see
/// [`bucket::on_bucket_time`]) unless it is later; with no bucket, the
/// [`ResourceState::hold`] does. Never shortens a hold.
pub fn hold_until(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        state.hold = state.hold.max(until);
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
/// [`held_until`]) holds the new state until the same end (see
/// [`hold_until`]): a reload while an upstream's 429 holds the resource
/// does not let calls through before the upstream said they may come.
///
/// The buckets are held, not drained: what `adopt` makes does not depend
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
    let until = held_until(&old);
    let mut state = ResourceState {
        leases: old.leases,
        ..ResourceState::fresh(spec, now)
    };
    if until > now {
        hold_until(&mut state, spec, now, until);
    }
    state
}
