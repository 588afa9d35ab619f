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
mod tests {
    use super::*;

    const P: BucketParams = BucketParams::new(3.0, 2.0, 1_000_000.0);

    /// States of [`P`] to check the merges on: drained, partly used,
    /// booked ahead (negative), held (`nb`), fresh; at assorted times.
    fn sample_states() -> [BucketState; 8] {
        let at = |tokens, ts, nb| BucketState { tokens, ts, nb };
        [
            at(0.0, 10, 0),
            at(1.0, 999_999, 0),
            at(2.5, 400_000, 0),
            at(2.999_999, 5, 0),
            at(-4.5, 123_456_789, 0),
            at(3.0, 0, 2_000_000),
            at(0.25, 77, 9_000_000),
            BucketState::fresh(&P, 700_000),
        ]
    }

    /// The raw merge never allows more than either state, under any limits,
    /// at any later time.
    #[test]
    fn fewest_allows_no_more_than_either_state_under_any_limits() {
        let limits = [
            P,
            BucketParams::new(10.0, 10.0, 3_600_000_000.0),
            BucketParams::new(7.0, 3.0, 1_000_003.0),
            BucketParams::new(1.0, 1000.0, 1_000_000.0),
        ];
        let states = sample_states();
        for a in states {
            for b in states {
                let f = fewest(a, b);
                for q in limits {
                    for later in [0, 1, 333_333, 5_000_000, 86_400_000_000] {
                        let now = f.ts + later;
                        let (rf, ra, rb) =
                            (refill(f, &q, now), refill(a, &q, now), refill(b, &q, now));
                        assert!(
                            rf.tokens <= ra.tokens && rf.tokens <= rb.tokens,
                            "{a:?} {b:?} {q:?}"
                        );
                        assert!(rf.nb >= ra.nb.max(rb.nb));
                    }
                }
            }
        }
    }

    /// The merge never allows more than either state, now or later, and
    /// equals a state merged with a fresh bucket (or itself).
    #[test]
    fn tighter_allows_no_more_than_either_state_at_any_later_time() {
        let states = sample_states();
        for a in states {
            for b in states {
                let t = tighter(a, b, &P);
                assert_eq!(t, tighter(b, a, &P), "{a:?} {b:?}");
                for now in [t.ts, t.ts + 1, t.ts + 333_333, t.ts + 5_000_000] {
                    let (rt, ra, rb) = (refill(t, &P, now), refill(a, &P, now), refill(b, &P, now));
                    // A refill in two steps rounds apart from one in one
                    // step, by an ulp or so.
                    const ULPS: f64 = 1e-12;
                    assert!(
                        rt.tokens <= ra.tokens + ULPS && rt.tokens <= rb.tokens + ULPS,
                        "{a:?} {b:?} {now}"
                    );
                    assert!(rt.nb >= ra.nb.max(rb.nb));
                }
            }
            let alone = tighter(a, BucketState::fresh(&P, 0), &P);
            assert_eq!(
                alone,
                refill(a, &P, a.ts),
                "a fresh bucket takes nothing off"
            );
        }
    }

    #[test]
    fn ceil_micros_is_the_rounding_it_describes() {
        let described = |x: f64| {
            let nearest = x.round();
            if (x - nearest).abs() < 1e-3 {
                nearest as Micros
            } else {
                x.ceil() as Micros
            }
        };
        let mut xs = vec![
            0.0,
            -0.0,
            -1.5,
            1e-4,
            0.999,
            0.9995,
            1.0,
            1.0005,
            1.001,
            2.5,
            1e15 + 0.5,
            9.007e15,
            // Either side of 2^63, where the conversions change.
            9_223_372_036_854_774_784.0,
            9_223_372_036_854_775_808.0,
            9_223_372_036_854_777_856.0,
            1.8e19,
            1e30,
            f64::INFINITY,
        ];
        // A deterministic sweep over fractions near 0, 1/2 and 1, at
        // magnitudes from 1 µs to years.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let whole = (seed >> 20) % 100_000_000_000_000;
            let frac = [0.0, 1e-3, 0.5, 1.0 - 1e-3][(seed % 4) as usize]
                + ((seed >> 8) % 2001) as f64 * 1e-6
                - 1e-3;
            xs.push(whole as f64 + frac);
            xs.push(frac.abs() * 3.0);
        }
        for x in xs {
            assert_eq!(ceil_micros(x), described(x), "x = {x:e}");
        }
        assert_eq!(ceil_micros(f64::NAN), 0);
    }

    #[test]
    fn a_shortfall_is_the_wait_rounded_in_one_piece() {
        // The wait as one expression, the form `shortfall` splits in two.
        let in_one_piece = |s: &BucketState, p: &BucketParams, now: Micros, cost: f64| {
            let deficit = cost - s.tokens;
            let rate = if deficit > 0.0 {
                ceil_micros(deficit * p.micros_per_token())
            } else {
                0
            };
            rate.max(s.nb.saturating_sub(now))
        };
        let params = [
            P,
            BucketParams::new(1.0, 1.0, 1.0),
            BucketParams::new(5e6, 7.0, 3e7),
        ];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200_000 {
            let p = params[(next() % 3) as usize];
            let cost = (next() % 4) as f64;
            // Tokens around the cost, down to a tiny deficit whose rate is
            // near the 1e-3 µs the rounding turns on.
            let near = [0.0, 1e-9, 1e-3 * p.tokens_per_micro(), 0.5, 3.0][(next() % 5) as usize];
            let tokens = cost - near * [1.0, -1.0, 0.999, 1.001][(next() % 4) as usize];
            let now = 1_000_000 + next() % 10;
            let s = BucketState {
                tokens,
                ts: now,
                nb: [0, now - 1, now, now + 1, now + 5_000][(next() % 5) as usize],
            };
            let whole = in_one_piece(&s, &p, now, cost);
            let split = shortfall(&s, &p, now, cost);
            assert_eq!(
                split.map_or(0, Shortfall::micros),
                whole,
                "{s:?} {p:?} {cost}"
            );
            assert_eq!(split.is_none(), whole == 0, "{s:?} {p:?} {cost}");
        }
    }

    #[test]
    fn refill_is_capped_and_clamped() {
        let s = BucketState {
            tokens: 0.0,
            ts: 1_000_000,
            nb: 0,
        };
        assert_eq!(refill(s, &P, 1_500_000).tokens, 1.0);
        assert_eq!(refill(s, &P, 9_000_000).tokens, 3.0);
        assert_eq!(refill(s, &P, 10), s, "an earlier now changes nothing");
        // More tokens than the capacity (a burst lowered since): capped,
        // also with no time passed.
        let over = BucketState { tokens: 9.0, ..s };
        assert_eq!(refill(over, &P, 10).tokens, 3.0);
        assert_eq!(refill(over, &P, 1_000_000).tokens, 3.0);
    }

    #[test]
    fn reserve_spaces_waiters_by_one_token() {
        let mut s = BucketState::fresh(&P, 0);
        let mut waits = vec![];
        for _ in 0..8 {
            let (n, w, booked) = reserve(s, &P, 0, 1.0, u64::MAX);
            assert!(booked);
            s = n;
            waits.push(w);
        }
        assert_eq!(
            waits,
            [0, 0, 0, 500_000, 1_000_000, 1_500_000, 2_000_000, 2_500_000]
        );
    }

    #[test]
    fn reserve_beyond_max_wait_books_nothing() {
        let s = BucketState {
            tokens: 0.0,
            ts: 0,
            nb: 0,
        };
        let (n, w, booked) = reserve(s, &P, 0, 1.0, 100_000);
        assert!(!booked);
        assert_eq!(w, 500_000);
        assert_eq!(n.tokens, 0.0);
    }

    #[test]
    fn penalty_is_never_shortened() {
        let s = BucketState::fresh(&P, 0);
        let long = penalize(s, &P, 0, 10_000_000);
        let short = penalize(long, &P, 1, 2_000_000);
        assert_eq!(short.nb, 10_000_000);
        assert_eq!(short.tokens, 0.0);
    }

    /// A hold asked from a `now` behind the bucket's `ts` lasts as long
    /// from `ts`: time does not run backwards for a penalty either.
    #[test]
    fn a_hold_from_a_lagging_now_lasts_as_long_from_ts() {
        let s = BucketState {
            tokens: 1.0,
            ts: 10_000_000,
            nb: 0,
        };
        let held = penalize(s, &P, 5_000_000, 7_000_000);
        assert_eq!((held.tokens, held.nb), (0.0, 12_000_000));
        assert_eq!(try_take(held, &P, 10_000_000, 1.0).1, 2_000_000);
        let out = reconcile(s, &P, 5_000_000, 0.0, Some(7_000_000));
        assert_eq!((out.tokens, out.nb), (0.0, 12_000_000));
        let saturated = penalize(s, &P, 5_000_000, u64::MAX);
        assert_eq!(saturated.nb, u64::MAX);
    }

    #[test]
    fn reconcile_never_widens() {
        let s = BucketState {
            tokens: 1.0,
            ts: 0,
            nb: 0,
        };
        assert_eq!(reconcile(s, &P, 0, 2.0, None).tokens, 1.0);
        assert_eq!(reconcile(s, &P, 0, 0.5, None).tokens, 0.5);
        let held = reconcile(s, &P, 0, 0.0, Some(7_000_000));
        assert_eq!((held.tokens, held.nb), (0.0, 7_000_000));
    }

    #[test]
    fn idle_only_when_full_and_unheld() {
        let s = BucketState {
            tokens: 2.0,
            ts: 0,
            nb: 0,
        };
        assert!(!is_idle(&s, &P, 0));
        assert!(is_idle(&s, &P, 500_000));
        let held = BucketState {
            tokens: 3.0,
            ts: 0,
            nb: 5_000_000,
        };
        assert!(!is_idle(&held, &P, 1_000_000));
        assert_eq!(ttl(&held, &P, 1_000_000), 4_000_000);
    }
}
