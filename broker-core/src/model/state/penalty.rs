//! Penalties on a resource: putting them on, carrying them across a reload,
//! and how long a call is still under one.

use super::{costs, LimitSpec, Micros, ResourceState};
use crate::model::bucket::{self, BucketState};
use crate::model::limits::Cost;

/// How long from `now` a call of `cost` is still under a penalty, whatever
/// the tokens: the latest `nb` of the buckets it draws on, or without rate
/// limits the [`ResourceState::penalty`]; 0 for none.
pub fn penalty_left(state: &ResourceState, spec: &LimitSpec, now: Micros, cost: Cost) -> Micros {
    if spec.buckets.is_empty() {
        return state.penalty.saturating_sub(now);
    }
    costs(spec, cost)
        .zip(&state.buckets)
        .filter(|((_, c), _)| *c > 0.0)
        .map(|(_, s)| s.nb.saturating_sub(now.max(s.ts)))
        .max()
        .unwrap_or(0)
}

/// Drains every bucket and penalizes it until `until`; without rate limits
/// sets [`ResourceState::penalty`] (never shortened).
pub fn penalize(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        return penalize_until(state, spec, now, until);
    }
    for (i, (_, p)) in spec.buckets.iter().enumerate() {
        state.buckets[i] = bucket::penalize(state.buckets[i], p, now, until);
    }
}

/// The latest not-before of `buckets` (made for any limits); 0 for none.
pub fn latest_not_before(buckets: &[BucketState]) -> Micros {
    buckets.iter().map(|b| b.nb).max().unwrap_or(0)
}

/// [`penalize`] without draining: each bucket's `nb` moves to `until` unless
/// later.
pub fn penalize_until(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        state.penalty = state.penalty.max(until);
        return;
    }
    for b in &mut state.buckets {
        b.nb = b.nb.max(bucket::on_bucket_time(b, now, until));
    }
}

/// The state of a key made for another number of rate limits (a reload), under `spec`: fresh
/// buckets, the same leases, and its penalty kept as a penalty (not drained, so the result does
/// not depend on when it runs).
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
    let until = latest_not_before(&old.buckets).max(old.penalty);
    let mut state = ResourceState {
        leases: old.leases,
        ..ResourceState::fresh(spec, now)
    };
    if until > now {
        penalize_until(&mut state, spec, now, until);
    }
    state
}
