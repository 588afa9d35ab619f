//! The token bucket of one limit: every transition as a pure function of
//! `(state, params, now)`, in µs. A `now` before `ts` is clamped to `ts`.
//! The Redis Lua mirrors these functions; the conformance suite checks both.

pub use super::time::ceil_micros;
use super::time::Micros;

/// One bucket's parameters: `amount` tokens per `period` µs, at most
/// `capacity` held.
///
/// ```
/// use broker_core::bucket::BucketParams;
/// let p = BucketParams::new(10.0, 2.0, 1_000_000.0);
/// assert_eq!(p.tokens_per_micro(), 2.0 / 1_000_000.0);
/// assert_eq!(p.micros_per_token(), 500_000.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketParams {
    capacity: f64,
    amount: f64,
    period: f64,
}

impl BucketParams {
    /// `amount` tokens per `period` µs, at most `capacity` held.
    pub const fn new(capacity: f64, amount: f64, period: f64) -> Self {
        Self {
            capacity,
            amount,
            period,
        }
    }

    /// Maximum tokens held (the burst).
    pub const fn capacity(&self) -> f64 {
        self.capacity
    }

    /// Tokens refilled per `period`.
    pub const fn amount(&self) -> f64 {
        self.amount
    }

    /// Refill period in microseconds.
    pub const fn period(&self) -> f64 {
        self.period
    }

    /// Tokens refilled per µs: `amount / period`.
    pub const fn tokens_per_micro(&self) -> f64 {
        self.amount / self.period
    }

    /// µs per token: `period / amount`.
    pub const fn micros_per_token(&self) -> f64 {
        self.period / self.amount
    }
}

/// Mutable state of one bucket.
///
/// ```
/// use broker_core::bucket::{BucketParams, BucketState};
/// let s = BucketState::fresh(&BucketParams::new(5.0, 1.0, 1_000.0), 7);
/// assert_eq!(s, BucketState { tokens: 5.0, ts: 7, nb: 0 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Tokens available at `ts`; negative when costs are booked ahead.
    pub tokens: f64,
    /// When `tokens` was last brought up to date.
    pub ts: Micros,
    /// Not-before: no token is handed out before this time.
    pub nb: Micros,
}

impl BucketState {
    /// A full bucket as of `now`.
    pub fn fresh(params: &BucketParams, now: Micros) -> Self {
        Self {
            tokens: params.capacity,
            ts: now,
            nb: 0,
        }
    }
}

/// Refills `state` to `now`, capped at capacity even with no time passed.
pub fn refill(mut state: BucketState, params: &BucketParams, now: Micros) -> BucketState {
    if now > state.ts {
        state.tokens += (now - state.ts) as f64 * params.tokens_per_micro();
        state.ts = now;
    }
    state.tokens = state.tokens.min(params.capacity);
    state
}

/// µs after `now` until `cost` tokens are available and `nb` has passed
/// (state refilled to `now`): the missing tokens' refill time, rounded up
/// by [`ceil_micros`], or the penalty left if longer.
pub fn wait_for(state: &BucketState, params: &BucketParams, now: Micros, cost: f64) -> Micros {
    let rate = ceil_micros((cost - state.tokens) * params.micros_per_token());
    rate.max(state.nb.saturating_sub(now))
}

/// Books `cost` for use `wait` µs after `now` (`wait` >= [`wait_for`]),
/// refilled to the send time capped at capacity; `ts` stays at `now`.
pub fn book_at(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    cost: f64,
    wait: Micros,
) -> BucketState {
    let mut s = refill(state, params, now);
    let ahead = wait as f64 * params.tokens_per_micro();
    s.tokens = (s.tokens + ahead).min(params.capacity) - cost - ahead;
    s
}

/// Corrects a charge by `delta = booked - actual` (capped at capacity). No
/// refund when `nb` is past `since` (a later penalty drained those tokens);
/// with `due`, only the [`unclaimed`] part is refunded.
pub fn settle(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    delta: f64,
    since: Option<Micros>,
    due: Option<Micros>,
) -> BucketState {
    let now = now.max(state.ts);
    let mut s = refill(state, params, now);
    if delta > 0.0 && s.nb > since.unwrap_or(now) {
        return s;
    }
    let delta = match due {
        Some(due) if delta > 0.0 => unclaimed(&s, params, now, delta, due),
        _ => delta,
    };
    s.tokens = (s.tokens + delta).min(params.capacity);
    s
}

/// The part of a refund of `delta`, booked for `due`, that no later booking
/// was granted (as x/time/rate's `Reservation.Cancel`).
///
/// ```
/// use broker_core::bucket::{book_at, unclaimed, BucketParams, BucketState};
/// let p = BucketParams::new(1.0, 10.0, 1_000_000.0); // 10 a second, burst 1
/// let mut s = BucketState::fresh(&p, 0);
/// for wait in [0, 100_000, 200_000] {
///     s = book_at(s, &p, 0, 1.0, wait); // due at 0, 100 and 200 ms
/// }
/// assert_eq!(unclaimed(&s, &p, 0, 1.0, 100_000), 0.0);
/// assert_eq!(unclaimed(&s, &p, 0, 1.0, 200_000), 1.0);
/// ```
pub fn unclaimed(
    state: &BucketState,
    params: &BucketParams,
    now: Micros,
    delta: f64,
    due: Micros,
) -> f64 {
    let debt = ceil_micros(-state.tokens * params.micros_per_token());
    let last = now.saturating_add(debt).max(state.nb);
    if last <= due {
        return delta;
    }
    let claimed = (last - due) as f64 * params.tokens_per_micro();
    (delta - claimed).max(0.0)
}

/// `at` on the caller's clock (reading `now`) moved onto the bucket's clock.
pub fn on_bucket_time(state: &BucketState, now: Micros, at: Micros) -> Micros {
    at.saturating_add(state.ts.saturating_sub(now))
}

/// Drains to zero (keeping debt) and penalizes until `until` (caller's
/// clock); never shortens a penalty.
pub fn penalize(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    until: Micros,
) -> BucketState {
    let until = on_bucket_time(&state, now, until);
    let mut s = refill(state, params, now);
    s.tokens = s.tokens.min(0.0);
    s.nb = s.nb.max(until);
    s
}

/// Narrows tokens to what the upstream says remains; `remaining == 0` also
/// penalizes until `reset_at`.
pub fn reconcile(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    remaining: f64,
    reset_at: Option<Micros>,
) -> BucketState {
    let reset_at = reset_at.map(|at| on_bucket_time(&state, now, at));
    let mut s = refill(state, params, now);
    s.tokens = s.tokens.min(remaining);
    if remaining <= 0.0 {
        if let Some(at) = reset_at {
            s.nb = s.nb.max(at);
        }
    }
    s
}

/// Whether the bucket at `now` is full and under no penalty.
pub fn is_idle(state: &BucketState, params: &BucketParams, now: Micros) -> bool {
    let s = refill(*state, params, now);
    s.tokens >= params.capacity && s.nb <= now
}

/// The tighter of two states of one bucket, both refilled to the later `ts`.
///
/// ```
/// use broker_core::bucket::{refill, tighter, BucketParams, BucketState};
/// let p = BucketParams::new(5.0, 5.0, 60_000_000.0); // 5 a minute
/// let drained = BucketState { tokens: 0.0, ts: 1_000, nb: 0 };
/// let used_one = BucketState { tokens: 4.0, ts: 2_000, nb: 0 };
/// let t = tighter(drained, used_one, &p);
/// assert_eq!(t.ts, 2_000);
/// assert!(t.tokens <= refill(drained, &p, 2_000).tokens);
/// ```
pub fn tighter(a: BucketState, b: BucketState, params: &BucketParams) -> BucketState {
    let ts = a.ts.max(b.ts);
    fewest(refill(a, params, ts), refill(b, params, ts))
}

/// A state never holding more than `a` or `b` under any limits (no refill).
///
/// ```
/// use broker_core::bucket::{fewest, BucketState};
/// let a = BucketState { tokens: 0.0, ts: 1_000, nb: 0 };
/// let b = BucketState { tokens: 4.0, ts: 2_000, nb: 5 };
/// assert_eq!(fewest(a, b), BucketState { tokens: 0.0, ts: 2_000, nb: 5 });
/// ```
pub fn fewest(a: BucketState, b: BucketState) -> BucketState {
    BucketState {
        tokens: a.tokens.min(b.tokens),
        ts: a.ts.max(b.ts),
        nb: a.nb.max(b.nb),
    }
}

/// How long the state must be kept: until full again and past `nb`.
///
/// ```
/// use broker_core::bucket::{ttl, BucketParams, BucketState};
/// let p = BucketParams::new(2.0, 1.0, 1_000.0);
/// assert_eq!(ttl(&BucketState { tokens: 0.0, ts: 0, nb: 0 }, &p, 0), 2_000);
/// ```
pub fn ttl(state: &BucketState, params: &BucketParams, now: Micros) -> Micros {
    let now = now.max(state.ts);
    wait_for(&refill(*state, params, now), params, now, params.capacity)
}

#[cfg(test)]
mod tests;
