//! Tests of [`super`].

use super::*;

#[test]
fn a_decision_is_allowed_exactly_when_no_reason_denies_it() {
    let decisions = [
        Decision::allow(None),
        Decision::allow(Some(7)),
        Decision::deny(DenyReason::Rate, 0),
        Decision::deny(DenyReason::Rate, 1_500_000),
        Decision::deny(DenyReason::Concurrency, 0),
    ];
    for d in decisions {
        assert_eq!(d.allowed, d.denied_by.is_none(), "{d:?}");
        assert!(d.allowed || d.lease.is_none(), "{d:?}");
    }
    assert_eq!(std::mem::size_of::<Decision>(), 32, "four words");
}
use crate::limits::RateLimit;

/// 100 a second and 100 a minute: a counter of 100 whose reset is a
/// second away fits both, and read as the shorter one's, left the
/// minute's budget full. Its IETF window (`w=60`) names the minute's
/// bucket, paced or not; without one, the shorter window is read.
#[test]
fn a_counter_with_a_window_narrows_the_bucket_of_that_window() {
    let spent = |window: Option<u64>| ObservedLimit {
        requests: Some(crate::observed::Observed {
            limit: Some(100),
            remaining: Some(0),
            reset: Some(std::time::Duration::from_secs(1)),
            window: window.map(std::time::Duration::from_secs),
            policy: Some("default".into()),
        }),
        ..ObservedLimit::default()
    };
    // The second one paced 5% under (`ResourceConfig::paced_limits`): 63,157,895 µs.
    for minute_ms in [60_000, 63_158] {
        let spec = spec(
            &[(100, 1_000, 100, false), (100, minute_ms, 100, false)],
            None,
        );
        let described = |o: &ObservedLimit| {
            (0..2)
                .filter(|i| observed_for(&spec, o, *i).is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(described(&spent(Some(60))), [1], "{minute_ms}");
        assert_eq!(described(&spent(None)), [0], "{minute_ms}");
        let mut s = ResourceState::fresh(&spec, 0);
        reconcile(&mut s, &spec, 0, &spent(Some(60)));
        let one = Cost::requests(1);
        assert_eq!(wait_all(&s, &spec, 0, one), 1_000_000, "{minute_ms}");
        // The second's bucket is untouched.
        let first = LimitSpec {
            buckets: spec.buckets[..1].to_vec(),
            ..spec.clone()
        };
        let s0 = ResourceState {
            buckets: s.buckets[..1].to_vec(),
            ..s.clone()
        };
        assert_eq!(wait_all(&s0, &first, 0, one), 0, "{minute_ms}");
    }
}

/// A resource with a concurrency limit alone has no bucket for a
/// penalty to put on: the state-wide penalty denies every `try` by rate,
/// with the wait to its end and no slot taken, puts a booking after
/// it, is never shortened, keeps the state from being dropped, and
/// ends on time.
#[test]
fn a_penalty_holds_a_resource_with_a_concurrency_limit_alone() {
    let spec = spec(&[], Some(2));
    let mut s = ResourceState::fresh(&spec, 0);
    assert!(try_acquire(&mut s, &spec, 0, Cost::default(), 1).allowed);
    penalize(&mut s, &spec, 1_000, 5_001_000);
    penalize(&mut s, &spec, 2_000, 3_000_000);
    assert_eq!(s.penalty, 5_001_000, "never shortened");
    assert_eq!(
        try_acquire(&mut s, &spec, 1_000_000, Cost::default(), 2),
        Decision::deny(DenyReason::Rate, 4_001_000)
    );
    assert_eq!(s.leases.len(), 1, "no slot taken while held");
    let late = book(&mut s, &spec, 1_000_000, Cost::requests(1), 4_000_000);
    assert_eq!((late.wait, late.booked), (4_001_000, false));
    let booked = book(&mut s, &spec, 1_000_000, Cost::requests(1), u64::MAX);
    assert_eq!((booked.wait, booked.booked), (4_001_000, true));
    assert_eq!(booked.since, Marks::new(1_000_000, []).due_at(5_001_000));
    assert_eq!(wait_all(&s, &spec, 1_000_000, Cost::default()), 4_001_000);
    release(&mut s, 1);
    assert!(!is_idle(&s, &spec, 5_000_999));
    assert_eq!(ttl(&s, &spec, 5_000_000), 1_000);
    assert!(is_idle(&s, &spec, 5_001_000));
    assert_eq!(
        try_acquire(&mut s, &spec, 5_001_000, Cost::default(), 3),
        Decision::allow(Some(3))
    );
    // Without any limit, the penalty is all there is to wait for.
    let none = self::spec(&[], None);
    let mut s = ResourceState::fresh(&none, 0);
    penalize(&mut s, &none, 0, u64::MAX);
    assert_eq!(
        try_acquire(&mut s, &none, 7, Cost::default(), 0),
        Decision::deny(DenyReason::Rate, u64::MAX - 7)
    );
}

/// With rate limits, a penalty goes on the buckets (`nb`) and leaves the
/// state-wide penalty at 0, so such states are what they were.
#[test]
fn a_penalty_with_rate_limits_holds_the_buckets_only() {
    for max_concurrent in [None, Some(2)] {
        let spec = spec(
            &[(1, 1_000, 3, false), (10, 1_000, 30, true)],
            max_concurrent,
        );
        let mut s = ResourceState::fresh(&spec, 0);
        penalize(&mut s, &spec, 0, 2_000_000);
        assert_eq!(s.penalty, 0);
        assert!(s.buckets.iter().all(|b| b.nb == 2_000_000));
    }
}

/// `penalty_left` reads the penalties of the buckets a cost draws on, not
/// their tokens: a spent tokens counter stops a call of tokens, not
/// one of requests alone; a penalty stops both. Each bucket's penalty is
/// read from its own time, so a caller whose clock lags waits no
/// longer than the store would make it. Without rate limits, the
/// state's penalty.
#[test]
fn penalty_left_is_the_penalty_of_the_buckets_a_cost_draws_on() {
    let two = spec(&[(1, 1_000, 3, false), (10, 1_000, 30, true)], None);
    let requests = Cost::default();
    let tokens = Cost {
        requests: 1,
        tokens: 5,
    };
    let mut s = ResourceState::fresh(&two, 0);
    while try_acquire(&mut s, &two, 0, requests, 0).allowed {}
    assert_eq!(penalty_left(&s, &two, 0, requests), 0, "drained, not held");
    s.buckets[1].nb = 2_000_000;
    assert_eq!(penalty_left(&s, &two, 0, requests), 0);
    assert_eq!(penalty_left(&s, &two, 500_000, tokens), 1_500_000);
    assert_eq!(penalty_left(&s, &two, 2_000_000, tokens), 0);
    s.buckets[1].ts = 500_000;
    assert_eq!(
        penalty_left(&s, &two, 0, tokens),
        1_500_000,
        "a lagging clock"
    );
    penalize(&mut s, &two, 500_000, 3_000_000);
    assert_eq!(penalty_left(&s, &two, 1_000_000, requests), 2_000_000);
    assert_eq!(penalty_left(&s, &two, 1_000_000, tokens), 2_000_000);
    let none = spec(&[], Some(1));
    let mut s = ResourceState::fresh(&none, 0);
    penalize(&mut s, &none, 0, 1_000_000);
    assert_eq!(penalty_left(&s, &none, 250_000, requests), 750_000);
    assert_eq!(penalty_left(&s, &none, 1_000_000, requests), 0);
}

/// A reload to another number of rate limits keeps the penalty, from
/// buckets to buckets, from buckets to the state-wide penalty and back,
/// and the leases; with no penalty in force the state is fresh.
#[test]
fn adopt_carries_the_penalty_and_the_leases_to_other_limits() {
    let one = spec(&[(1, 1_000, 3, false)], Some(2));
    let two = spec(&[(1, 1_000, 3, false), (10, 1_000, 30, true)], Some(2));
    let none = spec(&[], Some(2));
    let mut s = ResourceState::fresh(&one, 0);
    assert!(try_acquire(&mut s, &one, 0, Cost::default(), 7).allowed);
    penalize(&mut s, &one, 0, 3_000_000);
    let s = adopt(s, &two, 1_000_000);
    assert_eq!(s.leases.len(), 1);
    assert!(s
        .buckets
        .iter()
        .zip(&two.buckets)
        .all(|(b, (_, p))| b.nb == 3_000_000 && b.tokens == p.capacity()));
    assert_eq!(wait_all(&s, &two, 1_000_000, Cost::default()), 2_000_000);
    let s = adopt(s, &none, 1_500_000);
    assert_eq!((s.penalty, s.leases.len()), (3_000_000, 1));
    assert_eq!(wait_all(&s, &none, 1_500_000, Cost::default()), 1_500_000);
    let s = adopt(s, &one, 2_000_000);
    assert_eq!((s.penalty, s.buckets[0].nb), (0, 3_000_000));
    assert_eq!(wait_all(&s, &one, 2_000_000, Cost::default()), 1_000_000);
    // Over: a fresh state, the lease kept.
    let s = adopt(s, &two, 3_000_000);
    let fresh = ResourceState {
        leases: s.leases.clone(),
        ..ResourceState::fresh(&two, 3_000_000)
    };
    assert_eq!(s, fresh);
    assert_eq!(latest_not_before(&s.buckets).max(s.penalty), 0);
}

/// How long the state must be kept: the longest bucket TTL, lease, or
/// [`ResourceState::penalty`].
fn ttl(state: &ResourceState, spec: &LimitSpec, now: Micros) -> Micros {
    let buckets =
        (spec.buckets.iter().zip(&state.buckets)).map(|((_, p), s)| bucket::ttl(s, p, now));
    let leases = state.leases.iter().map(|l| l.expires.saturating_sub(now));
    buckets
        .chain(leases)
        .fold(state.penalty.saturating_sub(now), Micros::max)
}

fn spec(rates: &[(u64, u64, u64, bool)], max_concurrent: Option<u32>) -> LimitSpec {
    let mut limits = Limits::new();
    for &(amount, period_ms, burst, tokens) in rates {
        let unit = if tokens { Unit::Tokens } else { Unit::Requests };
        limits = limits.rate(
            RateLimit::per(amount, std::time::Duration::from_millis(period_ms))
                .with_burst(burst)
                .unit(unit),
        );
    }
    limits.max_concurrent = max_concurrent;
    LimitSpec::new(&limits, std::time::Duration::from_secs(1))
}
