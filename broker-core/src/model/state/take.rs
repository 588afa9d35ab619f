//! Taking from the buckets: `try`, `book` and `settle` over all rate limits.

use super::{
    costs, penalty_left, take_slot, Booking, Decision, DenyReason, LeaseId, LimitSpec, Marks,
    Micros, ResourceState,
};
use crate::model::bucket;
use crate::model::limits::Cost;

/// The longest wait among the buckets for `cost` at `now`, changing nothing:
/// the [`penalty_left`], or a bucket's refill if longer.
pub fn wait_all(state: &ResourceState, spec: &LimitSpec, now: Micros, cost: Cost) -> Micros {
    let charged = costs(spec, cost)
        .zip(&state.buckets)
        .filter(|((_, c), _)| *c > 0.0);
    let refills = charged.map(|((p, c), s)| {
        let now = now.max(s.ts);
        bucket::wait_for(&bucket::refill(*s, p, now), p, now, c)
    });
    refills.fold(penalty_left(state, spec, now, cost), Micros::max)
}

/// Books `cost` in every bucket for the same send time, `wait` after now.
fn book_all(state: &mut ResourceState, spec: &LimitSpec, now: Micros, cost: Cost, wait: Micros) {
    for ((p, c), s) in costs(spec, cost).zip(&mut state.buckets) {
        if c > 0.0 {
            *s = bucket::book_at(*s, p, now, c, wait);
        }
    }
}

/// Takes `cost` from every bucket and, under a concurrency limit, a slot
/// under `lease`, or nothing at all.
pub fn try_acquire(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    cost: Cost,
    lease: LeaseId,
) -> Decision {
    let wait = wait_all(state, spec, now, cost);
    if wait > 0 {
        return Decision::deny(DenyReason::Rate, wait);
    }
    if !take_slot(state, spec, now, lease) {
        return Decision::deny(DenyReason::Concurrency, 0);
    }
    book_all(state, spec, now, cost, 0);
    Decision::allow(spec.max_concurrent.map(|_| lease))
}

/// Books `cost` in every bucket for the latest of their earliest times, or
/// nothing if that is beyond `max_wait`. Slots are not booked.
pub fn book(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    cost: Cost,
    max_wait: Micros,
) -> Booking {
    let wait = wait_all(state, spec, now, cost);
    let marks =
        costs(spec, cost)
            .zip(&state.buckets)
            .map(|((_, c), s)| if c > 0.0 { s.nb.max(now) } else { now });
    let since = Marks::new(now, marks).due_at(now.saturating_add(wait));
    let booked = wait <= max_wait;
    if booked {
        book_all(state, spec, now, cost, wait);
    }
    Booking {
        wait,
        booked,
        since,
    }
}

/// Corrects every bucket's charge from `booked` to `actual`; `since` is the
/// settled booking's [`Booking::since`] (see [`bucket::settle`]).
pub fn settle(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    booked: Cost,
    actual: Cost,
    since: Option<Marks>,
) {
    for (i, (u, p)) in spec.buckets.iter().enumerate() {
        let delta = booked.of(*u) as f64 - actual.of(*u) as f64;
        if delta != 0.0 {
            let (mark, due) = (since.map(|m| m.of(i)), since.map(|m| m.due()));
            state.buckets[i] = bucket::settle(state.buckets[i], p, now, delta, mark, due);
        }
    }
}
