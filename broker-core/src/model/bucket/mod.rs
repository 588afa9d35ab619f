//! The token bucket, one limit: the reference implementation of every
//! transition as a pure function of `(state, params, now)`.
//!
//! A bucket holds `tokens` (fractional, negative while reservations are
//! booked ahead), `ts` (the time `tokens` was last brought up to date) and
//! `nb` (not-before: nothing is handed out before it, even if refilled).
//! Time is in microseconds. A `now` earlier than `ts` is clamped to `ts`, so
//! time never runs backwards inside a bucket.
//!
//! The Redis backend's Lua scripts mirror these functions line by line; the
//! conformance suite checks that both agree.

pub use super::time::ceil_micros;
use super::time::Micros;
use super::verdict::{LocalVerdict, RefillTime};

/// Static parameters of one bucket: `amount` tokens per `period` µs, at most
/// `capacity` tokens held. All three are exact integers stored as `f64`.
/// Built by [`BucketParams::new`], which also computes the two rates the
/// transitions multiply by (a multiplication instead of a division on
/// every decision). The fields are read through accessors, so the
/// quotients always match them.
///
/// ```
/// use broker_core::bucket::BucketParams;
/// let p = BucketParams::new(10.0, 2.0, 1_000_000.0);
/// assert_eq!(p.tokens_per_micro(), 2.0 / 1_000_000.0);
/// assert_eq!(p.micros_per_token(), 500_000.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketParams {
    /// Maximum tokens held (the burst).
    capacity: f64,
    /// Tokens refilled per `period`.
    amount: f64,
    /// Refill period in microseconds.
    period: f64,
    /// `amount / period`.
    tokens_per_micro: f64,
    /// `period / amount`.
    micros_per_token: f64,
}

impl BucketParams {
    /// `amount` tokens per `period` µs, at most `capacity` held.
    pub const fn new(capacity: f64, amount: f64, period: f64) -> Self {
        Self {
            capacity,
            amount,
            period,
            tokens_per_micro: amount / period,
            micros_per_token: period / amount,
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

    /// Tokens refilled per µs: `amount / period`, as one division rounds
    /// it (the Lua mirror computes the same quotient).
    pub const fn tokens_per_micro(&self) -> f64 {
        self.tokens_per_micro
    }

    /// µs per token: `period / amount`, as one division rounds it.
    pub const fn micros_per_token(&self) -> f64 {
        self.micros_per_token
    }
}

/// Mutable state of one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Tokens available at `ts`; negative when reservations are booked ahead.
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

/// Refills `state` to `now` (clamped to `state.ts`), capped at capacity:
/// also with no time passed, so a bucket kept across a re-registration
/// with a smaller burst holds no more than the new burst.
pub fn refill(state: BucketState, params: &BucketParams, now: Micros) -> BucketState {
    let (tokens, ts) = if now <= state.ts {
        (state.tokens, state.ts)
    } else {
        (
            state.tokens + (now - state.ts) as f64 * params.tokens_per_micro,
            now,
        )
    };
    BucketState {
        tokens: tokens.min(params.capacity),
        ts,
        nb: state.nb,
    }
}

/// How long after `now` until `cost` tokens are available and `nb` has
/// passed, for a state already refilled to `now`. Rounded up to whole µs
/// by [`ceil_micros`].
pub fn wait_for(state: &BucketState, params: &BucketParams, now: Micros, cost: f64) -> Micros {
    shortfall(state, params, now, cost).map_or(0, Shortfall::micros)
}

/// A wait before its rounding: what [`wait_for`] rounds, kept apart so
/// that a caller deciding under a lock can round the wait after the lock
/// is released.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shortfall {
    /// The refill time the missing tokens need, in µs, unrounded (zero
    /// when no token is missing).
    rate: f64,
    /// How long `nb` still holds the bucket, in µs.
    held: Micros,
}

impl Shortfall {
    /// The wait in whole µs, as [`wait_for`] gives it: at least 1.
    pub fn micros(self) -> Micros {
        ceil_micros(self.rate).max(self.held)
    }

    /// The denial as a store that answers in process gives it: with no
    /// hold in force, the refill time before rounding
    /// ([`LocalVerdict::Short`]), whose rounding gives [`Shortfall::micros`];
    /// else the wait rounded at once.
    pub fn local_verdict(self) -> LocalVerdict {
        match self.held {
            0 => LocalVerdict::Short(RefillTime::new(self.rate)),
            _ => LocalVerdict::Rate(self.micros()),
        }
    }
}

/// The [`Shortfall`] of `cost` for a state already refilled to `now`, or
/// `None` when the wait is zero.
///
/// [`ceil_micros`] rounds to 0 exactly the values below 1e-3 (and NaN):
/// from 1e-3 up to 1 it gives 1, from 1 up at least 1. So the wait is zero
/// when the missing tokens need less than 1e-3 µs and `nb` has passed.
pub fn shortfall(
    state: &BucketState,
    params: &BucketParams,
    now: Micros,
    cost: f64,
) -> Option<Shortfall> {
    let deficit = cost - state.tokens;
    let held = state.nb.saturating_sub(now);
    if deficit <= 0.0 && held == 0 {
        return None;
    }
    let rate = if deficit > 0.0 {
        deficit * params.micros_per_token
    } else {
        0.0
    };
    if (rate.is_nan() || rate < 1e-3) && held == 0 {
        return None;
    }
    Some(Shortfall { rate, held })
}

/// Books `cost` to be used `wait` µs after `now` (clamped to `ts`), for a
/// wait at least as long as [`wait_for`] gives. The tokens are taken as of
/// the send time: refill up to then is capped at capacity, so a bucket that
/// would be full before the send loses what the cap cuts off, exactly as a
/// strict upstream's bucket does. The state keeps `ts` at now; the refill
/// between now and the send is credited back so that refilling to the send
/// time yields exactly `min(capacity, tokens + refill) - cost`.
pub fn book(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    cost: f64,
    wait: Micros,
) -> BucketState {
    let now = now.max(state.ts);
    let mut s = refill(state, params, now);
    let ahead = wait as f64 * params.tokens_per_micro;
    s.tokens = (s.tokens + ahead).min(params.capacity) - cost - ahead;
    s
}

/// `try`: takes `cost` if it is available now; otherwise leaves the tokens
/// and reports the wait. Returns `(new state, wait)`; `wait == 0` means taken.
pub fn try_take(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    cost: f64,
) -> (BucketState, Micros) {
    let now = now.max(state.ts);
    let s = refill(state, params, now);
    let wait = wait_for(&s, params, now, cost);
    if wait == 0 {
        return (book(s, params, now, cost, 0), 0);
    }
    (s, wait)
}

/// `reserve`: books `cost` at the earliest time it fits, if that is within
/// `max_wait`. Returns `(new state, wait, booked)`. Booking drives `tokens`
/// negative, so the next reservation is spaced after this one.
pub fn reserve(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    cost: f64,
    max_wait: Micros,
) -> (BucketState, Micros, bool) {
    let now = now.max(state.ts);
    let s = refill(state, params, now);
    let wait = wait_for(&s, params, now, cost);
    if wait > max_wait {
        return (s, wait, false);
    }
    (book(s, params, now, cost, wait), wait, true)
}

/// `settle`: corrects a charge after the work. `delta = reserved - actual`:
/// positive refunds (capped at capacity), negative charges the difference.
///
/// `since` is this bucket's mark of the settled reservation
/// ([`crate::state::Marks`]: the store's time of the booking, or the end of
/// the hold the bucket was under then if later), `None` when there is none
/// (then `now`). No refund is made if the bucket is held past the
/// mark (`nb` after it): that hold, by a penalty or an exhausted upstream
/// counter, was put on after the booking, and its drain took tokens the
/// refund would give back. A cost booked under a hold is refunded while
/// no other hold has come since (the drain came before the booking). A
/// charge of more is made whatever the hold.
///
/// `due` is when the settled cost was (or was to be) used, on the store's
/// clock. A refund gives back only what no later booking was granted (see
/// [`unclaimed`]); without `due`, the whole refund.
///
/// Not seen: a second drain within a hold, ending no later than it (a
/// penalty never shortens `nb`, so such a drain leaves no mark); a refund
/// after it can give back up to the refill of the hold so far. Nor a hold
/// whose bucket was then dropped as idle (full, the hold passed: see
/// [`is_idle`]; the stores drop such states): a booking made before the
/// hold and settled after the drop is refunded, by its unused part at
/// most.
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

/// The part of a refund of `delta`, booked for `due`, that no later
/// booking was granted: `delta` less the refill from `due` to the last
/// booking (x/time/rate's `Reservation.Cancel`), 0 at least. For a state
/// refilled to `now`, the last booking is when its debt is refilled, or
/// its hold `nb` if later (a booking may wait for it).
///
/// ```
/// use broker_core::bucket::{reserve, unclaimed, BucketParams, BucketState};
/// let p = BucketParams::new(1.0, 10.0, 1_000_000.0); // 10 a second, burst 1
/// let mut s = BucketState::fresh(&p, 0);
/// for _ in 0..3 {
///     s = reserve(s, &p, 0, 1.0, u64::MAX).0; // due at 0, 100 and 200 ms
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
    let debt = if state.tokens < 0.0 {
        ceil_micros(-state.tokens * params.micros_per_token)
    } else {
        0
    };
    let last = now.saturating_add(debt).max(state.nb);
    if last <= due {
        return delta;
    }
    let claimed = (last - due) as f64 * params.tokens_per_micro;
    if claimed < delta {
        delta - claimed
    } else {
        0.0
    }
}

/// `at`, a time on the caller's clock, which reads `now`, as a time on the
/// bucket's: moved forward by as much as `now` is clamped to `ts` (a
/// caller whose clock lags the one that last wrote the bucket). So a hold
/// asked for `at - now` from the caller's now lasts as long from the
/// bucket's, instead of ending the lag early (or having ended already)
/// for everyone. Saturating.
pub fn on_bucket_time(state: &BucketState, now: Micros, at: Micros) -> Micros {
    at.saturating_add(state.ts.saturating_sub(now))
}

/// `penalize`: after a real upstream 429. Drains the bucket to zero (keeping
/// any booked debt) and moves `nb` to `until` unless it is already later:
/// a penalty is never shortened. `until` is on the caller's clock, as
/// [`on_bucket_time`] reads it.
pub fn penalize(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    until: Micros,
) -> BucketState {
    let until = on_bucket_time(&state, now, until);
    let now = now.max(state.ts);
    let mut s = refill(state, params, now);
    s.tokens = s.tokens.min(0.0);
    s.nb = s.nb.max(until);
    s
}

/// `reconcile`: narrows the bucket to what the upstream says remains.
/// Never widens: `tokens = min(tokens, remaining)`. `remaining == 0` also
/// holds the bucket until `reset_at` (monotone like [`penalize`]; on the
/// caller's clock, as [`on_bucket_time`] reads it).
pub fn reconcile(
    state: BucketState,
    params: &BucketParams,
    now: Micros,
    remaining: f64,
    reset_at: Option<Micros>,
) -> BucketState {
    let reset_at = reset_at.map(|at| on_bucket_time(&state, now, at));
    let now = now.max(state.ts);
    let mut s = refill(state, params, now);
    s.tokens = s.tokens.min(remaining);
    if remaining <= 0.0 {
        if let Some(at) = reset_at {
            s.nb = s.nb.max(at);
        }
    }
    s
}

/// Whether the bucket, refilled to `now`, is indistinguishable from a fresh
/// one (full and not held): such a state can be dropped without loss.
pub fn is_idle(state: &BucketState, params: &BucketParams, now: Micros) -> bool {
    let s = refill(*state, params, now.max(state.ts));
    s.tokens >= params.capacity && s.nb <= now
}

/// The tighter of two states of one bucket: from `max(a.ts, b.ts)` on,
/// it never holds more tokens than either (the fewer of the two, both
/// refilled to that time) and is held until the later not-before. A store
/// that keeps a bounded number of states folds a state it must drop into
/// such a merge, so the key's next state never holds more than its own
/// would have (see broker-memory's bound). Refill is monotone, so the
/// merge stays the tighter of the two at every later time too (as any
/// bucket refilled in steps does, up to the rounding of a step).
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
    let (a, b) = (refill(a, params, ts), refill(b, params, ts));
    BucketState {
        tokens: if a.tokens < b.tokens {
            a.tokens
        } else {
            b.tokens
        },
        ts,
        nb: a.nb.max(b.nb),
    }
}

/// A state that never holds more than `a` or `b` under any limits: the
/// fewer tokens, at the later refill time, held until the later
/// not-before. Merged without refilling either, so it holds whatever
/// rate refills it afterwards (a state kept across a reload is refilled
/// under the new limits, so no refill under the old ones may be read
/// into it); [`tighter`] is the closer merge for states of one set of
/// limits.
///
/// ```
/// use broker_core::bucket::{fewest, BucketState};
/// let a = BucketState { tokens: 0.0, ts: 1_000, nb: 0 };
/// let b = BucketState { tokens: 4.0, ts: 2_000, nb: 5 };
/// assert_eq!(fewest(a, b), BucketState { tokens: 0.0, ts: 2_000, nb: 5 });
/// ```
pub fn fewest(a: BucketState, b: BucketState) -> BucketState {
    BucketState {
        tokens: if a.tokens < b.tokens {
            a.tokens
        } else {
            b.tokens
        },
        ts: a.ts.max(b.ts),
        nb: a.nb.max(b.nb),
    }
}

/// How long the state must be kept: until it is full again and `nb` has
/// passed. After that, dropping it equals a fresh bucket.
pub fn ttl(state: &BucketState, params: &BucketParams, now: Micros) -> Micros {
    let now = now.max(state.ts);
    let s = refill(*state, params, now);
    let to_full = wait_for(&s, params, now, params.capacity);
    to_full.max(s.nb.saturating_sub(now))
}

#[cfg(test)]
mod tests;
