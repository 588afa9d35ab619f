//! One ceiling bounds both the wait for a slot and every retry pause: a
//! penalty set after a 429 (one pause long) never makes the next
//! booking exceed the ceiling, so the broker never fails a retry on its
//! own before the upstream is asked again.

use std::time::Duration;

use broker_core::clock::micros;
use broker_core::state::{self, ResourceState};
use broker_core::{LimitSpec, Limits, OutcomeClass, RateLimit, RetryPolicy};
use proptest::prelude::*;

fn limits_strategy() -> impl Strategy<Value = Limits> {
    prop::collection::vec(
        (1u64..1000, 1u64..7_200_000, prop::option::of(1u64..1000)),
        1..3,
    )
    .prop_map(|rates| {
        let mut l = Limits::new();
        for (amount, period_ms, burst) in rates {
            let mut r = RateLimit::per(amount, Duration::from_millis(period_ms));
            r.burst = burst;
            l = l.rate(r);
        }
        l
    })
}

fn policy_strategy() -> impl Strategy<Value = RetryPolicy> {
    (1u32..10, 1u64..10_000, 0u64..3_600, 0u32..4, 0u64..10_000).prop_map(
        |(max_attempts, base_ms, ceiling_s, windows, margin_ms)| RetryPolicy {
            max_attempts,
            base_backoff: Duration::from_millis(base_ms),
            wait_ceiling: Duration::from_secs(ceiling_s),
            ceiling_windows: windows,
            ceiling_margin: Duration::from_millis(margin_ms),
        },
    )
}

proptest! {
    #[test]
    fn every_pause_is_at_most_the_acquire_ceiling(
        limits in limits_strategy(),
        policy in policy_strategy(),
        attempt in 1u32..64,
        retry_after_s in prop::option::of(0u64..1_000_000),
    ) {
        let ceiling = policy.ceiling(&limits);
        let retry_after = retry_after_s.map(Duration::from_secs);
        prop_assert!(policy.rate_limited_pause(attempt, retry_after, &limits) <= ceiling);
        let unbounded = RetryPolicy { max_attempts: u32::MAX, ..policy.clone() };
        let jittered = unbounded.pause(OutcomeClass::Transient, attempt, None, &limits);
        prop_assert!(jittered.unwrap() <= ceiling);
        for class in [OutcomeClass::RateLimited, OutcomeClass::Transient] {
            if let Some(p) = policy.pause(class, attempt, retry_after, &limits) {
                prop_assert!(p <= ceiling);
            }
        }
    }

    #[test]
    fn after_a_penalty_of_one_pause_the_next_booking_fits_the_ceiling(
        limits in limits_strategy(),
        policy in policy_strategy(),
        attempt in 1u32..64,
        retry_after_s in prop::option::of(0u64..1_000_000),
        start_s in 0u64..1000,
    ) {
        // The enqueue loop: book (booked), 429, penalize for the pause,
        // sleep the pause, book again within the same ceiling.
        let spec = LimitSpec::new(&limits, Duration::from_secs(60));
        let ceiling = micros(policy.ceiling(&limits));
        let now = start_s * 1_000_000;
        let mut s = ResourceState::fresh(&spec, now);
        let cost = broker_core::Cost::default();
        let first = state::book(&mut s, &spec, now, cost, ceiling);
        prop_assert!(first.booked);
        let sent = now + first.wait;
        let pause = policy.rate_limited_pause(attempt, retry_after_s.map(Duration::from_secs), &limits);
        state::penalize(&mut s, &spec, sent, sent + micros(pause));
        let again = state::book(&mut s, &spec, sent + micros(pause), cost, ceiling);
        prop_assert!(again.booked, "wait {} > ceiling {}", again.wait, ceiling);
    }
}

#[test]
fn fatal_outcomes_get_no_pause_and_the_budget_ends_retries() {
    let limits = Limits::new().rate(RateLimit::per_minute(1));
    let p = RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    assert_eq!(p.pause(OutcomeClass::Fatal, 1, None, &limits), None);
    assert_eq!(p.pause(OutcomeClass::Ok, 1, None, &limits), None);
    assert!(p
        .pause(OutcomeClass::RateLimited, 2, None, &limits)
        .is_some());
    assert_eq!(p.pause(OutcomeClass::RateLimited, 3, None, &limits), None);
    assert_eq!(p.pause(OutcomeClass::Transient, 3, None, &limits), None);
}
