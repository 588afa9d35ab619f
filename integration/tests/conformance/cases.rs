//! The behaviour cases. Each takes an [`Env`] and asserts; the list at the
//! bottom ([`for_each_case!`]) turns them into tests on every backend.

use std::time::Duration;

use broker_core::state::DenyReason;
use broker_core::{
    Cost, LimitSpec, Limits, Observed, ObservedLimit, RateLimit, Renewal, Store, Unit,
};
use broker_testkit::Tally;

use super::env::Env;
use crate::common::seed;

const S: u64 = 1_000_000;
const HOUR: Duration = Duration::from_secs(3600);

fn spec(limits: Limits) -> LimitSpec {
    LimitSpec::new(&limits, Duration::from_secs(5))
}

/// Burst 3, 2 per second: the seed quota.
fn seed_quota() -> LimitSpec {
    seed::seed_spec()
}

async fn try_n(b: &dyn Store, key: &str, spec: &LimitSpec, cost: Cost, n: usize) -> Vec<bool> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(b.try_acquire(key, spec, cost).await.unwrap().allowed);
    }
    out
}

pub async fn seed_shared_bucket_spaces_eight_jobs_with_no_429(env: &Env) {
    let sends = seed::shared_bucket_send_times(&*env.backend, &env.key("seed")).await;
    assert_eq!(sends, [0, 0, 0, S / 2, S, 3 * S / 2, 2 * S, 5 * S / 2]);
    assert_eq!(seed::replay(&sends), Tally { ok: 8, rejected: 0 });
}

pub async fn seed_separate_buckets_send_six_at_once_and_four_are_rejected(env: &Env) {
    let sends = seed::separate_buckets_send_times(&*env.backend, &env.key("seed")).await;
    assert_eq!(sends.iter().filter(|&&t| t == 0).count(), 6);
    assert_eq!(seed::replay(&sends), Tally { ok: 4, rejected: 4 });
}

pub async fn seed_penalty_holds_the_next_two_bookings_to_four_seconds(env: &Env) {
    let key = env.key("seed");
    seed::shared_bucket_send_times(&*env.backend, &key).await;
    let got = seed::penalty_then_two_bookings(&*env.backend, &env.clock, &key).await;
    assert_eq!(got, [4 * S, 4 * S]);
}

pub async fn try_denies_with_the_wait_for_one_token_and_consumes_nothing(env: &Env) {
    let (b, key, spec) = (&*env.backend, env.key("t"), seed_quota());
    assert_eq!(try_n(b, &key, &spec, Cost::default(), 3).await, [true; 3]);
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.denied_by, Some(DenyReason::Rate));
    assert_eq!(d.wait, S / 2);
    env.advance_ms(250);
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert_eq!(d.wait, S / 4, "the denied try took nothing");
    env.advance_ms(250);
    assert!(
        b.try_acquire(&key, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

pub async fn all_limits_pass_or_none_is_consumed(env: &Env) {
    let (b, key) = (&*env.backend, env.key("multi"));
    let spec = spec(
        Limits::new()
            .rate(RateLimit::per_second(10).with_burst(5))
            .rate(RateLimit::per_second(100).unit(Unit::Tokens)),
    );
    assert!(
        b.try_acquire(&key, &spec, Cost::tokens(80))
            .await
            .unwrap()
            .allowed
    );
    let d = b.try_acquire(&key, &spec, Cost::tokens(80)).await.unwrap();
    assert!(!d.allowed, "the token limit denies");
    assert_eq!(d.wait, 600_000);
    // The denied call took no request either: 4 of 5 remain.
    assert_eq!(
        try_n(b, &key, &spec, Cost::requests(1), 5).await,
        [true, true, true, true, false]
    );
}

pub async fn zero_cost_for_a_unit_leaves_its_bucket_alone(env: &Env) {
    let (b, key) = (&*env.backend, env.key("zero"));
    let spec = spec(
        Limits::new()
            .rate(RateLimit::per_second(1).with_burst(1))
            .rate(RateLimit::per_second(10).unit(Unit::Tokens)),
    );
    let no_requests = Cost {
        requests: 0,
        tokens: 5,
    };
    assert_eq!(
        try_n(b, &key, &spec, no_requests, 3).await,
        [true, true, false]
    );
    assert!(
        b.try_acquire(&key, &spec, Cost::requests(1))
            .await
            .unwrap()
            .allowed
    );
}

pub async fn concurrency_slots_are_limited_and_release_is_idempotent(env: &Env) {
    let (b, key) = (&*env.backend, env.key("conc"));
    let spec = spec(Limits::new().max_concurrent(2));
    let a = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    let c = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert!(a.allowed && c.allowed);
    assert_ne!(a.lease, c.lease);
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert!(!d.allowed);
    assert_eq!((d.denied_by, d.wait), (Some(DenyReason::Concurrency), 0));
    assert!(b.release(&key, a.lease.unwrap()).await.unwrap());
    assert!(!b.release(&key, a.lease.unwrap()).await.unwrap());
    assert!(b.take_slot(&key, &spec).await.unwrap().is_some());
    assert!(b.take_slot(&key, &spec).await.unwrap().is_none());
}

pub async fn a_dead_holders_lease_expires_after_lease_ttl(env: &Env) {
    let (b, key) = (&*env.backend, env.key("lease"));
    let spec = spec(Limits::new().max_concurrent(1));
    let held = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert!(held.allowed);
    env.advance_ms(4_999);
    assert!(
        !b.try_acquire(&key, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
    env.advance_ms(1);
    assert!(
        b.try_acquire(&key, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !b.release(&key, held.lease.unwrap()).await.unwrap(),
        "expired and purged"
    );
}

/// Whether one more holder gets the slot of `key` now.
async fn slot_taken(b: &dyn Store, key: &str, spec: &LimitSpec) -> bool {
    b.try_acquire(key, spec, Cost::default())
        .await
        .unwrap()
        .allowed
}

/// A renewal extends a live lease; an expired one is not brought back as
/// it was, but taken again under the same lease while a slot is free
/// (`Retaken`), and is `Gone` when every slot is another holder's.
pub async fn a_renewed_lease_outlives_its_ttl_and_an_expired_one_is_taken_again_or_gone(env: &Env) {
    let (b, key) = (&*env.backend, env.key("renew"));
    let spec = spec(Limits::new().max_concurrent(1));
    let held = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    let lease = held.lease.unwrap();
    env.advance_ms(4_000);
    let renewed = b.renew(&key, &spec, lease).await.unwrap();
    assert_eq!(renewed, Renewal::Held, "live: renewed");
    env.advance_ms(4_999);
    assert!(
        !slot_taken(b, &key, &spec).await,
        "held to 5 s after the renewal"
    );
    env.advance_ms(1);
    let renewed = b.renew(&key, &spec, lease).await.unwrap();
    assert_eq!(renewed, Renewal::Retaken, "expired, the slot free");
    assert!(!slot_taken(b, &key, &spec).await, "held again under it");
    assert!(b.release(&key, lease).await.unwrap());
    assert!(slot_taken(b, &key, &spec).await, "the slot is free");
    let renewed = b.renew(&key, &spec, lease).await.unwrap();
    assert_eq!(renewed, Renewal::Gone, "released, the slot another's");
    let renewed = b.renew(&key, &spec, 12_345).await.unwrap();
    assert_eq!(renewed, Renewal::Gone, "never held, no slot free");
}

pub async fn book_beyond_max_wait_books_nothing(env: &Env) {
    let (b, key, spec) = (&*env.backend, env.key("r"), seed_quota());
    try_n(b, &key, &spec, Cost::default(), 3).await;
    let r = b
        .book(&key, &spec, Cost::default(), Duration::from_millis(100))
        .await
        .unwrap();
    assert!(!r.booked);
    assert_eq!(r.wait, S / 2);
    let r = b.book(&key, &spec, Cost::default(), HOUR).await.unwrap();
    assert_eq!(
        (r.booked, r.wait),
        (true, S / 2),
        "the refused one booked nothing"
    );
}

pub async fn settle_refunds_unused_cost_and_charges_extra(env: &Env) {
    let (b, key) = (&*env.backend, env.key("settle"));
    let spec = spec(Limits::new().rate(RateLimit::per_second(100).unit(Unit::Tokens)));
    assert!(
        b.try_acquire(&key, &spec, Cost::tokens(100))
            .await
            .unwrap()
            .allowed
    );
    b.settle(&key, &spec, Cost::tokens(100), Cost::tokens(40), None)
        .await
        .unwrap();
    assert!(
        b.try_acquire(&key, &spec, Cost::tokens(60))
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !b.try_acquire(&key, &spec, Cost::tokens(1))
            .await
            .unwrap()
            .allowed
    );
    b.settle(&key, &spec, Cost::tokens(0), Cost::tokens(50), None)
        .await
        .unwrap();
    let d = b.try_acquire(&key, &spec, Cost::tokens(1)).await.unwrap();
    assert_eq!(d.wait, 510_000, "50 tokens of debt, then one more");
}

/// A refund settled while a penalty is on is not made (the penalty's drain took
/// the unused tokens); a charge is; after the penalty, refunds are made again.
pub async fn a_refund_is_not_made_while_a_penalty_is_on(env: &Env) {
    let (b, key) = (&*env.backend, env.key("settle-held"));
    // 60 tokens a minute: one a second, a burst of 60.
    let spec = spec(Limits::new().rate(RateLimit::per_minute(60).unit(Unit::Tokens)));
    let tokens = |n| Cost::tokens(n);
    assert!(
        b.try_acquire(&key, &spec, tokens(60))
            .await
            .unwrap()
            .allowed
    );
    b.penalize(&key, &spec, Duration::from_secs(2))
        .await
        .unwrap();
    // The call used 10 of its 60: the 50 are not given back during the penalty.
    b.settle(&key, &spec, tokens(60), tokens(10), None)
        .await
        .unwrap();
    // Another used one more than it booked: charged.
    b.settle(&key, &spec, tokens(0), tokens(1), None)
        .await
        .unwrap();
    env.advance_ms(2_000);
    // -1 + 2 refilled = 1 token.
    let d = b.try_acquire(&key, &spec, tokens(2)).await.unwrap();
    assert_eq!((d.allowed, d.wait), (false, S), "one token, not 51");
    b.settle(&key, &spec, tokens(10), tokens(0), None)
        .await
        .unwrap();
    assert!(
        b.try_acquire(&key, &spec, tokens(11))
            .await
            .unwrap()
            .allowed
    );
    assert!(!b.try_acquire(&key, &spec, tokens(1)).await.unwrap().allowed);
}

/// With the booking's mark (`Booking::since`), a refund follows the
/// penalties put on after the booking: a cost booked under a penalty is given
/// back (the drain came first); a cost booked before a penalty is not, even
/// once the penalty has ended, and even when the penalty ended before the cost
/// was due.
pub async fn a_refund_follows_the_penalties_put_on_after_the_booking(env: &Env) {
    let (b, key) = (&*env.backend, env.key("settle-booked"));
    let spec = spec(Limits::new().rate(RateLimit::per_minute(60).unit(Unit::Tokens)));
    let tokens = |n| Cost::tokens(n);
    let within = Duration::from_secs(60);
    let before = b.book(&key, &spec, tokens(60), within).await.unwrap();
    assert_eq!((before.booked, before.wait), (true, 0));
    b.penalize(&key, &spec, Duration::from_secs(2))
        .await
        .unwrap();
    let under = b.book(&key, &spec, tokens(5), within).await.unwrap();
    assert_eq!((under.booked, under.wait), (true, 5 * S));
    assert_eq!(
        under.since.of(0) - before.since.of(0),
        2 * S,
        "booked under the penalty"
    );
    // Cancelled: given back in full.
    b.settle(&key, &spec, tokens(5), tokens(0), Some(under.since))
        .await
        .unwrap();
    env.advance_ms(3_000);
    // The first used 10 of its 60, settled after the penalty: nothing back.
    b.settle(&key, &spec, tokens(60), tokens(10), Some(before.since))
        .await
        .unwrap();
    let d = b.try_acquire(&key, &spec, tokens(4)).await.unwrap();
    assert_eq!(
        (d.allowed, d.wait),
        (false, S),
        "3 tokens refilled, no more"
    );
    assert!(b.try_acquire(&key, &spec, tokens(3)).await.unwrap().allowed);
    // A cost booked 10 s ahead, then a 1 s penalty that ends before it is due,
    // then the booking cancelled: the penalty's drain is not undone.
    env.advance_ms(60_000);
    assert!(
        b.try_acquire(&key, &spec, tokens(60))
            .await
            .unwrap()
            .allowed
    );
    let ahead = b.book(&key, &spec, tokens(10), within).await.unwrap();
    assert_eq!(ahead.wait, 10 * S);
    env.advance_ms(8_000);
    b.penalize(&key, &spec, Duration::from_secs(1))
        .await
        .unwrap();
    b.settle(&key, &spec, tokens(10), tokens(0), Some(ahead.since))
        .await
        .unwrap();
    env.advance_ms(1_000);
    let d = b.try_acquire(&key, &spec, tokens(1)).await.unwrap();
    assert_eq!((d.allowed, d.wait), (false, 2 * S), "still 1 token of debt");
}

/// Issue 39's repro: burst 1, 10 a second, three booked at once (due at
/// 0, 100 and 200 ms). The second, cancelled at 50 ms, gives nothing back
/// (the third was granted its refill), so a booking at 60 ms is due at
/// 300 ms, not 200 ms beside the third; the last one cancelled gives all
/// of its cost back (x/time/rate's `Reservation.Cancel`).
pub async fn a_cancelled_booking_gives_back_only_what_no_later_booking_was_granted(env: &Env) {
    let (b, key) = (&*env.backend, env.key("cancelled"));
    let spec = spec(Limits::new().rate(RateLimit::per_second(10).with_burst(1)));
    let one = Cost::requests(1);
    let mut booked = Vec::new();
    for _ in 0..3 {
        booked.push(b.book(&key, &spec, one, HOUR).await.unwrap());
    }
    let waits: Vec<_> = booked.iter().map(|r| r.wait).collect();
    assert_eq!(waits, [0, S / 10, S / 5]);
    env.advance_ms(50);
    b.settle(&key, &spec, one, Cost::requests(0), Some(booked[1].since))
        .await
        .unwrap();
    env.advance_ms(10);
    let late = b.book(&key, &spec, one, HOUR).await.unwrap();
    assert_eq!(late.wait, S * 3 / 10 - S * 6 / 100, "due at 300 ms");
    // The last booking cancelled: all back, so the next is due at 300 ms.
    b.settle(&key, &spec, one, Cost::requests(0), Some(late.since))
        .await
        .unwrap();
    let again = b.book(&key, &spec, one, HOUR).await.unwrap();
    assert_eq!(again.wait, late.wait);
}

/// A refund after the work follows the same rule: 2 tokens of burst, 1 a
/// second; one booked and sent at 0, one more taken at 0.5 s, then the
/// first settled as unused. An upstream that charged only the second has
/// 1 token left at 0.5 s (it was full until then), not 1.5: a cost of 2
/// waits a second.
pub async fn a_refund_after_the_work_gives_back_no_more_than_the_upstream_kept(env: &Env) {
    let (b, key) = (&*env.backend, env.key("after-work"));
    let spec = spec(Limits::new().rate(RateLimit::per_second(1).with_burst(2).unit(Unit::Tokens)));
    let sent = b.book(&key, &spec, Cost::tokens(1), HOUR).await.unwrap();
    assert_eq!((sent.booked, sent.wait), (true, 0));
    env.advance_ms(500);
    assert!(
        b.try_acquire(&key, &spec, Cost::tokens(1))
            .await
            .unwrap()
            .allowed
    );
    b.settle(
        &key,
        &spec,
        Cost::tokens(1),
        Cost::tokens(0),
        Some(sent.since),
    )
    .await
    .unwrap();
    let d = b.try_acquire(&key, &spec, Cost::tokens(2)).await.unwrap();
    assert_eq!((d.allowed, d.wait), (false, S));
}

/// A limit of one request a second (burst 10) and 60 tokens a minute on
/// `key`, its tokens counter reported out until 2 s from now.
async fn tokens_out_for_two_seconds(b: &dyn Store, key: &str) -> LimitSpec {
    let spec = spec(
        Limits::new()
            .rate(RateLimit::per_second(1).with_burst(10))
            .rate(RateLimit::per_minute(60).unit(Unit::Tokens)),
    );
    let out = ObservedLimit {
        tokens: Some(Observed {
            limit: Some(60),
            remaining: Some(0),
            reset: Some(Duration::from_secs(2)),
            ..Default::default()
        }),
        ..Default::default()
    };
    b.reconcile(key, &spec, &out).await.unwrap();
    spec
}

/// The mark of a cost charged to two buckets, one of them held when it was
/// booked, is the earlier of their penalties: a shorter penalty afterwards,
/// which holds the other bucket for less than the first penalty, is seen, and
/// a cancelled booking gives nothing back to the bucket it drained.
pub async fn a_refund_sees_a_penalty_on_any_bucket_it_charged(env: &Env) {
    let (b, key) = (&*env.backend, env.key("settle-two"));
    let spec = tokens_out_for_two_seconds(b, &key).await;
    let cost = Cost {
        requests: 5,
        tokens: 1,
    };
    let r = b
        .book(&key, &spec, cost, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((r.booked, r.wait), (true, 2 * S));
    env.advance_ms(1_000);
    b.penalize(&key, &spec, Duration::from_millis(500))
        .await
        .unwrap();
    b.settle(&key, &spec, cost, Cost::requests(0), Some(r.since))
        .await
        .unwrap();
    env.advance_ms(500);
    let requests = Cost::requests(1);
    let d = b.try_acquire(&key, &spec, requests).await.unwrap();
    assert_eq!(
        (d.allowed, d.wait),
        (false, S / 2),
        "half a request refilled since the drain, none given back"
    );
}

/// Each bucket has its own mark: a cost booked while only its tokens
/// counter is out (held until the reset) gives its unused tokens back, and
/// its requests too, when no penalty came since.
pub async fn a_refund_reaches_the_one_bucket_booked_under_a_penalty(env: &Env) {
    let (b, key) = (&*env.backend, env.key("settle-one-held"));
    let spec = tokens_out_for_two_seconds(b, &key).await;
    let estimate = Cost {
        requests: 1,
        tokens: 10,
    };
    let r = b
        .book(&key, &spec, estimate, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((r.booked, r.wait), (true, 10 * S));
    assert_eq!(r.since.of(1) - r.since.of(0), 2 * S, "the tokens' hold");
    // Used 4 of its 10 tokens: 6 back.
    b.settle(&key, &spec, estimate, Cost::tokens(4), Some(r.since))
        .await
        .unwrap();
    env.advance_ms(12_000);
    let d = b.try_acquire(&key, &spec, Cost::tokens(9)).await.unwrap();
    assert_eq!((d.allowed, d.wait), (false, S), "12 refilled, 4 used: 8");
    assert!(
        b.try_acquire(&key, &spec, Cost::tokens(8))
            .await
            .unwrap()
            .allowed
    );
}

pub async fn a_penalty_is_never_shortened(env: &Env) {
    let (b, key, spec) = (&*env.backend, env.key("p"), seed_quota());
    b.penalize(&key, &spec, Duration::from_secs(10))
        .await
        .unwrap();
    env.advance_ms(1_000);
    b.penalize(&key, &spec, Duration::from_secs(2))
        .await
        .unwrap();
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert_eq!(d.wait, 9 * S);
}

pub async fn a_penalty_longer_than_the_window_survives_other_acquires(env: &Env) {
    let (b, key, spec) = (&*env.backend, env.key("p"), seed_quota());
    b.penalize(&key, &spec, Duration::from_secs(30))
        .await
        .unwrap();
    for _ in 0..20 {
        env.advance_ms(1_000);
        let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
        assert!(!d.allowed);
    }
    env.advance_ms(10_000);
    assert!(
        b.try_acquire(&key, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

pub async fn reconcile_narrows_and_never_widens(env: &Env) {
    let (b, key, spec) = (&*env.backend, env.key("rec"), seed_quota());
    let seen = |remaining, reset| ObservedLimit {
        requests: Some(Observed {
            limit: Some(3),
            remaining: Some(remaining),
            reset,
            ..Default::default()
        }),
        ..Default::default()
    };
    b.reconcile(&key, &spec, &seen(1, None)).await.unwrap();
    assert_eq!(
        try_n(b, &key, &spec, Cost::default(), 2).await,
        [true, false]
    );
    env.advance_ms(1_000);
    b.reconcile(&key, &spec, &seen(3, None)).await.unwrap();
    assert_eq!(
        try_n(b, &key, &spec, Cost::default(), 3).await,
        [true, true, false],
        "remaining above what is left never adds tokens"
    );
    b.reconcile(&key, &spec, &seen(0, Some(Duration::from_secs(3))))
        .await
        .unwrap();
    env.advance_ms(1_000);
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert_eq!(d.wait, 2 * S, "remaining 0 holds until the reset");
}

pub async fn keys_with_separators_never_share_state(env: &Env) {
    let b = &*env.backend;
    let spec = spec(Limits::new().rate(RateLimit::per_second(1).with_burst(1)));
    let one = broker_core::keys::keyed(&env.key("a:b"), "c");
    let two = broker_core::keys::keyed(&env.key("a"), "b:c");
    assert_ne!(one, two);
    assert!(
        b.try_acquire(&one, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
    assert!(
        b.try_acquire(&two, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !b.try_acquire(&one, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

pub async fn a_bucket_idle_until_full_behaves_as_fresh(env: &Env) {
    let (b, key, spec) = (&*env.backend, env.key("idle"), seed_quota());
    try_n(b, &key, &spec, Cost::default(), 3).await;
    env.advance_ms(1_500);
    assert_eq!(
        try_n(b, &key, &spec, Cost::default(), 4).await,
        [true, true, true, false]
    );
    env.advance_ms(60_000);
    assert_eq!(
        try_n(b, &key, &spec, Cost::default(), 4).await,
        [true, true, true, false]
    );
}

/// A bucket kept under a smaller burst (a re-registration with the same
/// number of rate limits) holds no more than the new burst, also at the
/// instant of its last decision.
pub async fn a_smaller_burst_caps_a_kept_bucket_at_once(env: &Env) {
    let (b, key) = (&*env.backend, env.key("shrunk"));
    let wide = spec(Limits::new().rate(RateLimit::per_second(10)));
    assert_eq!(try_n(b, &key, &wide, Cost::default(), 1).await, [true]);
    let narrow = spec(Limits::new().rate(RateLimit::per_second(1)));
    assert_eq!(
        try_n(b, &key, &narrow, Cost::default(), 3).await,
        [true, false, false]
    );
}

/// The same for a cost above the new burst's tokens: the tokens kept
/// count as the new burst, and the wait is for the rest.
pub async fn a_smaller_burst_caps_a_large_cost_at_once(env: &Env) {
    let (b, key) = (&*env.backend, env.key("shrunk_cost"));
    let wide = spec(Limits::new().rate(RateLimit::per_second(10)));
    assert_eq!(try_n(b, &key, &wide, Cost::default(), 1).await, [true]);
    let narrow = spec(Limits::new().rate(RateLimit::per_second(1)));
    let d = b
        .try_acquire(&key, &narrow, Cost::requests(5))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.wait), (false, 4 * S));
}

/// A slot held stays held when the rate limits change in number.
pub async fn a_slot_held_survives_another_number_of_rate_limits(env: &Env) {
    let (b, key) = (&*env.backend, env.key("slots"));
    let one = spec(
        Limits::new()
            .rate(RateLimit::per_second(100))
            .max_concurrent(1),
    );
    let held = b.try_acquire(&key, &one, Cost::default()).await.unwrap();
    assert!(held.allowed);
    let two = spec(
        Limits::new()
            .rate(RateLimit::per_second(100))
            .rate(RateLimit::per_minute(1000))
            .max_concurrent(1),
    );
    let d = b.try_acquire(&key, &two, Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by),
        (false, Some(DenyReason::Concurrency))
    );
    assert!(b.release(&key, held.lease.unwrap()).await.unwrap());
    assert!(
        b.try_acquire(&key, &two, Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

/// A concurrency limit alone: no bucket for a penalty to drain or hold.
fn slots_only(n: u32) -> LimitSpec {
    spec(Limits::new().max_concurrent(n))
}

/// A penalty on a resource with a concurrency limit alone holds it for
/// every user of the store: `try` is denied by rate with the wait to the
/// penalty's end (no slot taken), a booking waits for that end, a shorter
/// penalty does not shorten it, and the slot held before it stays held.
pub async fn a_penalty_holds_a_resource_with_only_a_concurrency_limit(env: &Env) {
    let (b, key, spec) = (&*env.backend, env.key("slots"), slots_only(2));
    let held = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert!(held.allowed);
    b.penalize(&key, &spec, Duration::from_secs(3))
        .await
        .unwrap();
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by, d.wait, d.lease),
        (false, Some(DenyReason::Rate), 3 * S, None)
    );
    env.advance_ms(1_000);
    b.penalize(&key, &spec, Duration::from_secs(1))
        .await
        .unwrap();
    let within = |ms| Duration::from_millis(ms);
    let late = b
        .book(&key, &spec, Cost::default(), within(1_999))
        .await
        .unwrap();
    assert_eq!((late.wait, late.booked), (2 * S, false));
    let booked = b
        .book(&key, &spec, Cost::default(), within(2_000))
        .await
        .unwrap();
    assert_eq!((booked.wait, booked.booked), (2 * S, true));
    assert!(b.release(&key, held.lease.unwrap()).await.unwrap());
    env.advance_ms(1_999);
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert_eq!((d.allowed, d.wait), (false, 1_000));
    env.advance_ms(1);
    assert_eq!(
        try_n(b, &key, &spec, Cost::default(), 3).await,
        [true, true, false]
    );
    let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
    assert_eq!(d.denied_by, Some(DenyReason::Concurrency));
}

/// A penalty on a resource with a concurrency limit alone holds a key no
/// call has used yet, and a key of the same resource with no penalty is
/// not penalized.
pub async fn a_penalty_on_an_unused_key_with_only_a_concurrency_limit_holds_it(env: &Env) {
    let (b, spec) = (&*env.backend, slots_only(1));
    let (held, free) = (env.key("held"), env.key("free"));
    b.penalize(&held, &spec, Duration::from_millis(1_500))
        .await
        .unwrap();
    let d = b.try_acquire(&held, &spec, Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by, d.wait),
        (false, Some(DenyReason::Rate), 3 * S / 2)
    );
    assert!(
        b.try_acquire(&free, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
    env.advance_ms(1_500);
    assert!(
        b.try_acquire(&held, &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

/// A reload to another number of rate limits while a penalty holds the
/// resource (a 429's, from one rate limit, to two, to a concurrency limit
/// alone, and back): the new buckets start full but held until the
/// penalty's end, as the penalty of a state without buckets does, so no
/// reload lets a call through before the upstream said it may come. Each
/// limits' own penalty, shorter, does not shorten it; the slot held
/// before stays held.
pub async fn a_penalty_outlives_a_reload_to_another_number_of_rate_limits(env: &Env) {
    let (b, key) = (&*env.backend, env.key("reloaded"));
    let one = spec(Limits::new().rate(RateLimit::per_second(10)));
    let two = spec(
        Limits::new()
            .rate(RateLimit::per_second(10))
            .rate(RateLimit::per_minute(100))
            .max_concurrent(2),
    );
    let slots = slots_only(2);
    let held = b.try_acquire(&key, &two, Cost::default()).await.unwrap();
    assert!(held.allowed);
    let denied_for = |spec: &LimitSpec, ms: u64| {
        let spec = spec.clone();
        let key = key.clone();
        async move {
            let d = b.try_acquire(&key, &spec, Cost::default()).await.unwrap();
            assert_eq!(
                (d.allowed, d.denied_by, d.wait),
                (false, Some(DenyReason::Rate), ms * 1_000),
                "{spec:?}"
            );
        }
    };
    b.penalize(&key, &one, Duration::from_secs(3))
        .await
        .unwrap();
    denied_for(&two, 3_000).await;
    // Each penalty below is shorter than the first: it writes the state
    // under its limits without shortening the penalty.
    b.penalize(&key, &two, Duration::from_millis(1))
        .await
        .unwrap();
    denied_for(&one, 3_000).await;
    denied_for(&slots, 3_000).await;
    env.advance_ms(1_000);
    b.penalize(&key, &slots, Duration::from_millis(1))
        .await
        .unwrap();
    denied_for(&one, 2_000).await;
    denied_for(&two, 2_000).await;
    let late = b
        .book(&key, &two, Cost::default(), Duration::from_millis(1_999))
        .await
        .unwrap();
    assert_eq!((late.wait, late.booked), (2 * S, false));
    b.penalize(&key, &one, Duration::from_millis(1))
        .await
        .unwrap();
    denied_for(&slots, 2_000).await;
    env.advance_ms(2_000);
    assert!(b.release(&key, held.lease.unwrap()).await.unwrap());
    assert_eq!(
        try_n(b, &key, &slots, Cost::default(), 3).await,
        [true, true, false]
    );
    assert!(
        b.try_acquire(&key, &one, Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

/// What the first call under limits with another number of rate limits
/// made of a state under a penalty is what every later call finds, as
/// the reference's `state::adopt` keeps it: whether that first call was
/// a denied `try` (through each `try` script: many buckets, one bucket
/// with and without a concurrency limit), a `book` that booked
/// nothing, or a `take_slot`, a call 100 ms later, as the penalty ends,
/// is decided as the reference decides it on the state it adopted then.
pub async fn a_state_adopted_under_a_penalty_is_the_one_later_calls_find(env: &Env) {
    use broker_core::state::{self, ResourceState};
    use broker_core::Clock;
    let b = &*env.backend;
    let one = spec(Limits::new().rate(RateLimit::per_second(10)));
    let two = spec(
        Limits::new()
            .rate(RateLimit::per_second(10))
            .rate(RateLimit::per_minute(100)),
    );
    let one_held = spec(
        Limits::new()
            .rate(RateLimit::per_second(10))
            .max_concurrent(2),
    );
    let two_held = spec(
        Limits::new()
            .rate(RateLimit::per_second(10))
            .rate(RateLimit::per_minute(100))
            .max_concurrent(2),
    );
    /// The first call under the new limits.
    #[derive(Clone, Copy, Debug)]
    enum First {
        Try,
        Book,
        TakeSlot,
    }
    let cases = [
        ("to-two", &one, &two, First::Try),
        ("to-one", &two, &one, First::Try),
        ("to-one-held", &two, &one_held, First::Try),
        ("to-one-booked", &two, &one, First::Book),
        ("to-two-slot", &one, &two_held, First::TakeSlot),
    ];
    let penalty = Duration::from_millis(100);
    let t0 = env.clock.now();
    let mut reference = Vec::new();
    for (name, old, new, first) in cases {
        let key = env.key(name);
        b.penalize(&key, old, penalty).await.unwrap();
        let mut s = ResourceState::fresh(old, t0);
        state::penalize(&mut s, old, t0, t0 + 100_000);
        let mut s = state::adopt(s, new, t0);
        match first {
            First::Try => {
                let got = b.try_acquire(&key, new, Cost::default()).await.unwrap();
                let want = state::try_acquire(&mut s, new, t0, Cost::default(), 1);
                assert!(!want.allowed);
                assert_eq!((got.allowed, got.wait), (want.allowed, want.wait), "{name}");
            }
            First::Book => {
                let got = b
                    .book(&key, new, Cost::default(), Duration::ZERO)
                    .await
                    .unwrap();
                let want = state::book(&mut s, new, t0, Cost::default(), 0);
                assert!(!want.booked);
                assert_eq!((got.booked, got.wait), (want.booked, want.wait), "{name}");
            }
            First::TakeSlot => {
                let lease = b.take_slot(&key, new).await.unwrap();
                assert!(lease.is_some(), "{name}");
                assert!(state::take_slot(&mut s, new, t0, 1));
            }
        }
        reference.push((key, new, s));
    }
    env.advance_ms(100);
    let now = t0 + 100_000;
    for (key, new, mut s) in reference {
        for i in 0..3 {
            let got = b.try_acquire(&key, new, Cost::default()).await.unwrap();
            let want = state::try_acquire(&mut s, new, now, Cost::default(), 2 + i);
            assert_eq!(
                (got.allowed, got.denied_by, got.wait),
                (want.allowed, want.denied_by, want.wait),
                "{key}: call {i}"
            );
        }
    }
}

/// A reload and back while a penalty holds the resource (a replica on the
/// new limits, one still on the old): the call under the new limits,
/// denied by the penalty, took the state on for them all the same (as the
/// reference's `state::adopt`), so the old limits' next call, as the
/// penalty ends, takes it on again rather than finding the state it had
/// before the reload.
pub async fn a_denied_call_under_other_limits_takes_the_state_on(env: &Env) {
    use broker_core::state::{self, ResourceState};
    use broker_core::Clock;
    let (b, key) = (&*env.backend, env.key("and-back"));
    let one = spec(Limits::new().rate(RateLimit::per_second(10)));
    let two = spec(
        Limits::new()
            .rate(RateLimit::per_second(10))
            .rate(RateLimit::per_minute(100)),
    );
    let t0 = env.clock.now();
    b.penalize(&key, &one, Duration::from_millis(100))
        .await
        .unwrap();
    let mut s = ResourceState::fresh(&one, t0);
    state::penalize(&mut s, &one, t0, t0 + 100_000);
    let mut s = state::adopt(s, &two, t0);
    let d = b.try_acquire(&key, &two, Cost::default()).await.unwrap();
    let want = state::try_acquire(&mut s, &two, t0, Cost::default(), 1);
    assert_eq!((d.allowed, d.wait), (want.allowed, want.wait));
    env.advance_ms(100);
    let now = t0 + 100_000;
    let mut s = state::adopt(s, &one, now);
    for i in 0..3 {
        let got = b.try_acquire(&key, &one, Cost::default()).await.unwrap();
        let want = state::try_acquire(&mut s, &one, now, Cost::default(), 2 + i);
        assert_eq!(
            (got.allowed, got.denied_by, got.wait),
            (want.allowed, want.denied_by, want.wait),
            "call {i}"
        );
    }
}

/// `penalty_left` gives what the store stops a call of a cost for, as the
/// reference's `state::penalty_left` reads it, and changes nothing: a spent
/// tokens counter stops a call of tokens, not one of requests alone; a
/// penalty stops both, also as read under limits with another number of
/// rate limits (the state taken on) and with none (the state's penalty).
pub async fn penalty_left_gives_the_penalty_a_call_of_a_cost_meets(env: &Env) {
    let (b, key) = (&*env.backend, env.key("penalty_left"));
    let two = spec(
        Limits::new()
            .rate(RateLimit::per_second(10).with_burst(5))
            .rate(RateLimit::per_second(100).unit(Unit::Tokens)),
    );
    let requests = Cost::requests(1);
    let tokens = Cost::tokens(10);
    let left = |spec: &LimitSpec, cost: Cost| {
        let (spec, key) = (spec.clone(), key.clone());
        async move { b.wait_left(&key, &spec, cost).await.unwrap() }
    };
    assert_eq!(
        (left(&two, requests).await, left(&two, tokens).await),
        (0, 0)
    );
    assert_eq!(
        try_n(b, &key, &two, requests, 6).await,
        [true, true, true, true, true, false]
    );
    assert_eq!(left(&two, requests).await, 0, "drained, not held");
    let spent_tokens = ObservedLimit {
        tokens: Some(Observed {
            limit: Some(100),
            remaining: Some(0),
            reset: Some(Duration::from_secs(2)),
            ..Default::default()
        }),
        ..Default::default()
    };
    b.reconcile(&key, &two, &spent_tokens).await.unwrap();
    env.advance_ms(500);
    assert_eq!(left(&two, requests).await, 0, "the requests are not held");
    assert_eq!(left(&two, tokens).await, 3 * S / 2);
    b.penalize(&key, &two, Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(left(&two, requests).await, 3 * S);
    env.advance_ms(1_000);
    // Read under a single rate limit, and under none: the state taken on
    // keeps the penalty.
    let one = spec(Limits::new().rate(RateLimit::per_second(10)));
    assert_eq!(left(&one, requests).await, 2 * S);
    assert_eq!(left(&slots_only(1), requests).await, 2 * S);
    let d = b.try_acquire(&key, &slots_only(1), requests).await.unwrap();
    assert_eq!((d.allowed, d.wait), (false, 2 * S), "nothing changed");
    env.advance_ms(2_000);
    assert_eq!(left(&slots_only(1), requests).await, 0);
    assert!(
        b.try_acquire(&key, &slots_only(1), requests)
            .await
            .unwrap()
            .allowed
    );
}

/// Calls `$m!(case, case, ...)` with every case of the suite.
#[macro_export]
macro_rules! for_each_case {
    ($m:ident) => {
        $m!(
            seed_shared_bucket_spaces_eight_jobs_with_no_429,
            seed_separate_buckets_send_six_at_once_and_four_are_rejected,
            seed_penalty_holds_the_next_two_bookings_to_four_seconds,
            try_denies_with_the_wait_for_one_token_and_consumes_nothing,
            all_limits_pass_or_none_is_consumed,
            zero_cost_for_a_unit_leaves_its_bucket_alone,
            concurrency_slots_are_limited_and_release_is_idempotent,
            a_dead_holders_lease_expires_after_lease_ttl,
            a_renewed_lease_outlives_its_ttl_and_an_expired_one_is_taken_again_or_gone,
            book_beyond_max_wait_books_nothing,
            settle_refunds_unused_cost_and_charges_extra,
            a_refund_is_not_made_while_a_penalty_is_on,
            a_refund_follows_the_penalties_put_on_after_the_booking,
            a_refund_sees_a_penalty_on_any_bucket_it_charged,
            a_refund_reaches_the_one_bucket_booked_under_a_penalty,
            a_cancelled_booking_gives_back_only_what_no_later_booking_was_granted,
            a_refund_after_the_work_gives_back_no_more_than_the_upstream_kept,
            a_penalty_is_never_shortened,
            a_penalty_longer_than_the_window_survives_other_acquires,
            reconcile_narrows_and_never_widens,
            keys_with_separators_never_share_state,
            a_bucket_idle_until_full_behaves_as_fresh,
            a_smaller_burst_caps_a_kept_bucket_at_once,
            a_smaller_burst_caps_a_large_cost_at_once,
            a_slot_held_survives_another_number_of_rate_limits,
            a_penalty_holds_a_resource_with_only_a_concurrency_limit,
            a_penalty_on_an_unused_key_with_only_a_concurrency_limit_holds_it,
            a_penalty_outlives_a_reload_to_another_number_of_rate_limits,
            a_state_adopted_under_a_penalty_is_the_one_later_calls_find,
            a_denied_call_under_other_limits_takes_the_state_on,
            penalty_left_gives_the_penalty_a_call_of_a_cost_meets
        );
    };
}
