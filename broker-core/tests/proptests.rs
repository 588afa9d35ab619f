//! Properties of the bucket state machine under random operation sequences.

use broker_core::bucket::{self, BucketParams, BucketState};
use broker_testkit::StrictServer;
use proptest::prelude::*;

/// Books `cost` at the earliest time it fits within `max_wait` (0: now or
/// not at all), as `state::book` does for one bucket: `(state, wait, booked)`.
fn book(
    state: BucketState,
    params: &BucketParams,
    now: u64,
    cost: f64,
    max_wait: u64,
) -> (BucketState, u64, bool) {
    let now = now.max(state.ts);
    let s = bucket::refill(state, params, now);
    let wait = bucket::wait_for(&s, params, now, cost);
    if wait > max_wait {
        return (s, wait, false);
    }
    (bucket::book_at(s, params, now, cost, wait), wait, true)
}

fn params() -> impl Strategy<Value = BucketParams> {
    (
        1u64..20,
        1u64..20,
        prop::sample::select(vec![1_000u64, 250_000, 1_000_000, 60_000_000]),
    )
        .prop_map(|(burst, amount, period)| {
            BucketParams::new(burst as f64, amount as f64, period as f64)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the order and spacing of `try`s, no interval [0, t] admits
    /// more than burst + rate × t.
    #[test]
    fn try_never_admits_more_than_burst_plus_rate_times_elapsed(
        p in params(),
        steps in prop::collection::vec((0u64..2_000_000, 1u64..4), 1..200),
    ) {
        let mut s = BucketState::fresh(&p, 0);
        let mut now = 0u64;
        let mut admitted = 0.0;
        for (dt, cost) in steps {
            now += dt;
            let cost = (cost as f64).min(p.capacity());
            let (next, wait, _) = book(s, &p, now, cost, 0);
            s = next;
            if wait == 0 {
                admitted += cost;
            }
            let bound = p.capacity() + p.amount() * now as f64 / p.period();
            prop_assert!(admitted <= bound + 1e-9, "admitted {admitted} > {bound} at {now}");
        }
    }

    /// Bookings on one bucket form a schedule that a strict
    /// server with the same quota accepts in full.
    #[test]
    fn booked_schedule_passes_a_strict_server(
        burst in 1u64..10, amount in 1u64..10,
        asks in prop::collection::vec(0u64..3_000_000, 1..60),
    ) {
        let p = BucketParams::new(burst as f64, amount as f64, 1_000_000.0);
        let mut asks = asks;
        asks.sort_unstable();
        let mut s = BucketState::fresh(&p, 0);
        let mut sends = Vec::new();
        for at in asks {
            let (next, wait, booked) = book(s, &p, at, 1.0, u64::MAX);
            prop_assert!(booked);
            s = next;
            sends.push(at + wait);
        }
        let tally = StrictServer::new(burst, amount, 1_000_000).replay(&sends);
        prop_assert_eq!(tally.rejected, 0);
    }

    /// A penalty is never shortened, and nothing is handed out before it ends.
    #[test]
    fn penalize_is_monotone_and_stops_every_take(
        p in params(),
        untils in prop::collection::vec(0u64..100_000_000, 1..10),
        probes in prop::collection::vec(0u64..100_000_000, 1..20),
    ) {
        let mut s = BucketState::fresh(&p, 0);
        let mut longest = 0;
        for until in untils {
            s = bucket::penalize(s, &p, 0, until);
            longest = longest.max(until);
            prop_assert_eq!(s.nb, longest);
            prop_assert!(s.tokens <= 0.0);
        }
        let mut probes = probes;
        probes.sort_unstable();
        for at in probes {
            let (next, wait, _) = book(s, &p, at, 1.0, 0);
            if at < longest {
                prop_assert!(wait > 0, "taken at {at} before nb {longest}");
            }
            s = next;
        }
    }

    /// Settlements made while a penalty holds the bucket never give back
    /// what its drain took: when the penalty ends, the bucket holds no more
    /// than it would have without them.
    #[test]
    fn refunds_during_a_penalty_give_nothing_back(
        p in params(),
        before in -5.0f64..20.0, penalty in 1u64..10_000_000,
        settles in prop::collection::vec((0u64..10_000_000, -3.0f64..30.0), 1..20),
    ) {
        let fresh = BucketState { tokens: before.min(p.capacity()), ts: 0, nb: 0 };
        let penalized = bucket::penalize(fresh, &p, 0, penalty);
        let mut s = penalized;
        let mut settles = settles;
        settles.sort_by_key(|(at, _)| *at);
        for (at, delta) in settles.into_iter().filter(|(at, _)| *at < penalty) {
            s = bucket::settle(s, &p, at, delta, None, None);
        }
        let settled = bucket::refill(s, &p, penalty).tokens;
        let untouched = bucket::refill(penalized, &p, penalty).tokens;
        prop_assert!(
            settled <= untouched + 1e-9,
            "{settled} tokens when the penalty ends, {untouched} without the settlements"
        );
    }

    /// Reconcile only narrows: tokens never rise above what refill gives,
    /// and `nb` never moves back.
    #[test]
    fn reconcile_never_widens(
        p in params(),
        tokens in -5.0f64..20.0, nb in 0u64..10_000_000, at in 0u64..10_000_000,
        remaining in 0u64..40, reset in prop::option::of(0u64..10_000_000),
    ) {
        let s = BucketState { tokens: tokens.min(p.capacity()), ts: 0, nb };
        let refilled = bucket::refill(s, &p, at);
        let r = bucket::reconcile(s, &p, at, remaining as f64, reset.map(|d| at + d));
        prop_assert!(r.tokens <= refilled.tokens);
        prop_assert!(r.nb >= s.nb);
        if remaining == 0 {
            prop_assert!(r.tokens <= 0.0);
        }
    }

    /// An earlier `now` than `ts` never refills or rewinds the bucket.
    #[test]
    fn time_never_runs_backwards_inside_a_bucket(
        p in params(), tokens in 0.0f64..5.0, ts in 1_000u64..10_000_000, back in 1u64..1_000,
    ) {
        let s = BucketState { tokens: tokens.min(p.capacity()), ts, nb: 0 };
        let (after, ..) = book(s, &p, ts - back, 0.0, 0);
        prop_assert_eq!(after.ts, ts);
        prop_assert!(after.tokens <= s.tokens);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With two limits on one resource, every booking is booked in both
    /// for the same send time, and the schedule passes a strict server for
    /// each limit, including the one that was not the bottleneck.
    #[test]
    fn multi_limit_schedule_passes_a_strict_server_per_limit(
        b1 in 1u64..6, a1 in 1u64..6, b2 in 1u64..12, a2 in 1u64..12,
        asks in prop::collection::vec((0u64..20_000_000, 1u64..3), 1..60),
    ) {
        use broker_core::state::{self, LimitSpec, ResourceState};
        use broker_core::{Cost, Limits, RateLimit};
        use std::time::Duration;
        let limits = Limits::new()
            .rate(RateLimit::per(a1, Duration::from_secs(1)).with_burst(b1))
            .rate(RateLimit::per(a2, Duration::from_secs(10)).with_burst(b2));
        let spec = LimitSpec::new(&limits, Duration::from_secs(60));
        let mut st = ResourceState::fresh(&spec, 0);
        let mut asks = asks;
        asks.sort_unstable();
        let mut sends = Vec::new();
        for (at, how) in asks {
            if how == 1 {
                let r = state::book(&mut st, &spec, at, Cost::default(), u64::MAX);
                prop_assert!(r.booked);
                sends.push(at + r.wait);
            } else if state::try_acquire(&mut st, &spec, at, Cost::default(), 0).allowed {
                sends.push(at);
            }
        }
        prop_assert_eq!(StrictServer::new(b1, a1, 1_000_000).replay(&sends).rejected, 0);
        prop_assert_eq!(StrictServer::new(b2, a2, 10_000_000).replay(&sends).rejected, 0);
    }
}
