//! Tests of [`super`].

use super::*;

const P: BucketParams = BucketParams::new(3.0, 2.0, 1_000_000.0);

/// Books `cost` at the earliest time it fits within `max_wait` (0: now or
/// not at all), as `state::book` does for one bucket: `(state, wait, booked)`.
fn book(
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
    (book_at(s, params, now, cost, wait), wait, true)
}

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
                    let (rf, ra, rb) = (refill(f, &q, now), refill(a, &q, now), refill(b, &q, now));
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
fn a_wait_is_rounded_in_one_piece() {
    // The wait as the refill time and the penalty apart, a tiny rate
    // (below 1e-3 µs, or NaN) counting as none.
    let split = |s: &BucketState, p: &BucketParams, now: Micros, cost: f64| {
        let deficit = cost - s.tokens;
        let penalty = s.nb.saturating_sub(now);
        let rate = if deficit > 0.0 {
            deficit * p.micros_per_token()
        } else {
            0.0
        };
        if (deficit <= 0.0 || rate.is_nan() || rate < 1e-3) && penalty == 0 {
            return 0;
        }
        ceil_micros(rate).max(penalty)
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
        let whole = wait_for(&s, &p, now, cost);
        assert_eq!(split(&s, &p, now, cost), whole, "{s:?} {p:?} {cost}");
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
fn book_spaces_waiters_by_one_token() {
    let mut s = BucketState::fresh(&P, 0);
    let mut waits = vec![];
    for _ in 0..8 {
        let (n, w, booked) = book(s, &P, 0, 1.0, u64::MAX);
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
fn book_beyond_max_wait_books_nothing() {
    let s = BucketState {
        tokens: 0.0,
        ts: 0,
        nb: 0,
    };
    let (n, w, booked) = book(s, &P, 0, 1.0, 100_000);
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

/// A penalty asked from a `now` behind the bucket's `ts` lasts as long
/// from `ts`: time does not run backwards for a penalty either.
#[test]
fn a_penalty_from_a_lagging_now_lasts_as_long_from_ts() {
    let s = BucketState {
        tokens: 1.0,
        ts: 10_000_000,
        nb: 0,
    };
    let held = penalize(s, &P, 5_000_000, 7_000_000);
    assert_eq!((held.tokens, held.nb), (0.0, 12_000_000));
    assert_eq!(book(held, &P, 10_000_000, 1.0, 0).1, 2_000_000);
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
