//! Random operation sequences driven through the Rust reference
//! (`broker_core::state`) and through the Lua scripts on a real
//! redis-server: every decision must be identical, and after every step the
//! stored state must equal the reference's (bit for bit, once both are
//! refilled to now; a key Redis deleted as idle must be idle in the
//! reference too). The sequences run once on one client clock, and once on
//! two replicas of the backend whose clocks differ, each operation issued
//! by either: the reference is fed the `now` of the replica that issued it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use broker_core::bucket::{self, BucketParams, BucketState};
use broker_core::state::{self, Lease, Marks, ResourceState};
use broker_core::{
    Clock, Cost, LimitSpec, ManualClock, Micros, Observed, ObservedLimit, Renewal, Store, Unit,
};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;
use common::cases::run_numbered;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Try(Cost),
    Book(Cost, u64),
    TakeSlot,
    Release(usize),
    Renew(usize),
    /// Booked, actual, and the booking's due time as an offset from now
    /// (in µs, may be negative), if given.
    Settle(Cost, Cost, Option<i64>),
    Penalize(u64),
    Reconcile(Option<u64>, Option<u64>, Option<u64>),
    PenaltyLeft(Cost),
}

/// The replica of the backend that issues an operation. Both share the
/// redis-server; the lagging one's clock reads a fixed lag behind the
/// leading one's, so the buckets' `ts` it meets is often ahead of its now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replica {
    Leading,
    Lagging,
}

fn cost() -> impl Strategy<Value = Cost> {
    (0u64..4, 0u64..40).prop_map(|(requests, tokens)| Cost { requests, tokens })
}

/// What an upstream says remains: often 0, which holds the bucket until
/// the reset.
fn remaining(below: u64) -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..below]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![Just(1u64), Just(137), 0u64..3_000_000, Just(60_000_000)].prop_map(Op::Advance),
        4 => cost().prop_map(Op::Try),
        3 => (cost(), prop_oneof![Just(0u64), 0u64..5_000_000, Just(u64::MAX)])
            .prop_map(|(c, w)| Op::Book(c, w)),
        1 => Just(Op::TakeSlot),
        1 => (0usize..4).prop_map(Op::Release),
        1 => (0usize..4).prop_map(Op::Renew),
        1 => (cost(), cost(), prop::option::of(-5_000_000i64..5_000_000))
            .prop_map(|(a, b, at)| Op::Settle(a, b, at)),
        1 => (0u64..10_000_000).prop_map(Op::Penalize),
        1 => (prop::option::of(remaining(30)), prop::option::of(remaining(60)), prop::option::of(0u64..5_000_000))
            .prop_map(|(r, t, reset)| Op::Reconcile(r, t, reset)),
        1 => cost().prop_map(Op::PenaltyLeft),
    ]
}

/// A sequence of operations, each issued by a replica `replica` picks.
fn steps(replica: impl Strategy<Value = Replica>) -> impl Strategy<Value = Vec<(Replica, Op)>> {
    prop::collection::vec((replica, op()), 1..40)
}

/// How far the lagging replica's clock is behind: up to 20 s.
fn lag() -> impl Strategy<Value = Micros> {
    prop_oneof![Just(1u64), 0u64..=20_000_000, Just(20_000_000)]
}

fn params() -> impl Strategy<Value = BucketParams> {
    (
        1u64..20,
        1u64..50,
        prop::sample::select(vec![1_000u64, 250_000, 1_000_000, 7_000_000, 60_000_000]),
    )
        .prop_map(|(capacity, amount, period)| {
            BucketParams::new(capacity as f64, amount as f64, period as f64)
        })
}

/// Limits of up to two rate limits and a concurrency limit: about one in
/// six with no rate limit at all (a concurrency limit alone, or nothing),
/// where a penalty goes on the state itself (`ResourceState::penalty`).
fn spec() -> impl Strategy<Value = LimitSpec> {
    (
        prop::option::weighted(0.75, params()),
        prop::option::of(params()),
        prop::option::of(1u32..4),
        prop_oneof![Just(1_000u64), Just(2_000_000)],
    )
        .prop_map(|(requests, tokens, max_concurrent, lease_ttl)| {
            let mut buckets: Vec<_> = requests.map(|p| (Unit::Requests, p)).into_iter().collect();
            buckets.extend(tokens.map(|p| (Unit::Tokens, p)));
            LimitSpec {
                buckets,
                max_concurrent,
                lease_ttl,
            }
        })
}

/// The reference's state, created fresh on first use like MemoryBackend.
/// Buckets Redis dropped as idle are made fresh again by the next
/// operation that uses them, as of its now, as the scripts do (a lagging
/// replica's now is behind the one they were dropped at).
struct Reference {
    state: Option<ResourceState>,
    buckets_dropped: bool,
}

impl Reference {
    fn get(&mut self, spec: &LimitSpec, now: Micros) -> &mut ResourceState {
        let state = self
            .state
            .get_or_insert_with(|| ResourceState::fresh(spec, now));
        if std::mem::take(&mut self.buckets_dropped) {
            state.buckets = ResourceState::fresh(spec, now).buckets;
        }
        state
    }
}

/// A bucket as it will behave from `now` on: refilled to now, a passed
/// not-before forgotten.
fn normalized(s: &BucketState, p: &BucketParams, now: Micros) -> BucketState {
    let mut r = bucket::refill(*s, p, now.max(s.ts));
    if r.nb <= now {
        r.nb = 0;
    }
    r
}

fn sorted(mut leases: Vec<Lease>) -> Vec<Lease> {
    leases.sort_by_key(|l| l.id);
    leases
}

/// A replica of the Redis backend on its own client clock.
async fn replica(url: &str, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(url)
        .client_time(Arc::new(clock.clone()))
        .ttl_margin(Duration::from_secs(600))
        .connect()
        .await
        .expect("connect")
}

/// Runs `steps` on two replicas, the lagging one's clock `lag` behind the
/// leading one's (with no step by the lagging replica, the single-clock
/// case), comparing every result and, after every step, the stored state
/// with the reference's.
async fn run_case(
    url: &str,
    key: &str,
    spec: LimitSpec,
    lag: Micros,
    steps: Vec<(Replica, Op)>,
) -> Result<(), TestCaseError> {
    let leading_clock = ManualClock::new();
    leading_clock.set(1_000_000_000);
    let lagging_clock = ManualClock::new();
    lagging_clock.set(leading_clock.now() - lag);
    let leading = replica(url, &leading_clock).await;
    let lagging = if steps.iter().any(|(r, _)| *r == Replica::Lagging) {
        Some(replica(url, &lagging_clock).await)
    } else {
        None
    };
    let mut reference = Reference {
        state: None,
        buckets_dropped: false,
    };
    let mut held: Vec<u64> = Vec::new();
    for (by, op) in steps {
        let (redis, now) = match by {
            Replica::Leading => (&leading, leading_clock.now()),
            Replica::Lagging => (lagging.as_ref().unwrap(), lagging_clock.now()),
        };
        match op {
            Op::Advance(us) => {
                leading_clock.advance(Duration::from_micros(us));
                lagging_clock.advance(Duration::from_micros(us));
            }
            Op::Try(cost) => {
                let got = redis.try_acquire(key, &spec, cost).await.expect("try");
                let lease = got.lease.unwrap_or(0);
                let want = state::try_acquire(reference.get(&spec, now), &spec, now, cost, lease);
                prop_assert_eq!(got, want, "try {:?} at {}", cost, now);
                held.extend(got.lease);
            }
            Op::Book(cost, max_wait) => {
                let got = redis
                    .book(key, &spec, cost, Duration::from_micros(max_wait))
                    .await
                    .expect("book");
                let want = state::book(reference.get(&spec, now), &spec, now, cost, max_wait);
                prop_assert_eq!(got, want, "book {:?} within {} at {}", cost, max_wait, now);
            }
            Op::TakeSlot => {
                let got = redis.take_slot(key, &spec).await.expect("take_slot");
                let lease = got.unwrap_or(0);
                let want = state::take_slot(reference.get(&spec, now), &spec, now, lease);
                prop_assert_eq!(got.is_some(), want, "take_slot at {}", now);
                held.extend(got);
            }
            Op::Release(i) => {
                let lease = held.get(i).copied().unwrap_or(12345);
                let got = redis.release(key, lease).await.expect("release");
                let want = reference
                    .state
                    .as_mut()
                    .is_some_and(|s| state::release(s, lease));
                prop_assert_eq!(got, want, "release {}", lease);
            }
            Op::Renew(i) => {
                let lease = held.get(i).copied().unwrap_or(12345);
                let got = redis.renew(key, &spec, lease).await.expect("renew");
                let renewed = reference
                    .state
                    .as_mut()
                    .is_some_and(|s| state::renew(s, &spec, now, lease));
                // Not held: taken again under the lease if a slot is free.
                let want = if renewed {
                    Renewal::Held
                } else if state::take_slot(reference.get(&spec, now), &spec, now, lease) {
                    Renewal::Retaken
                } else {
                    Renewal::Gone
                };
                prop_assert_eq!(got, want, "renew {} at {}", lease, now);
            }
            Op::Settle(booked, actual, at) => {
                let marks = at.map(|d| Marks::new(now.saturating_add_signed(d), []));
                redis
                    .settle(key, &spec, booked, actual, marks)
                    .await
                    .expect("settle");
                let state = reference.get(&spec, now);
                state::settle(state, &spec, now, booked, actual, marks);
            }
            Op::Penalize(penalty) => {
                redis
                    .penalize(key, &spec, Duration::from_micros(penalty))
                    .await
                    .expect("penalize");
                state::penalize(reference.get(&spec, now), &spec, now, now + penalty);
            }
            Op::Reconcile(requests, tokens, reset) => {
                let observed = ObservedLimit {
                    requests: Some(Observed {
                        limit: None,
                        remaining: requests,
                        reset: reset.map(Duration::from_micros),
                        ..Default::default()
                    }),
                    tokens: tokens.map(|t| Observed {
                        limit: None,
                        remaining: Some(t),
                        reset: reset.map(Duration::from_micros),
                        ..Default::default()
                    }),
                    retry_after: None,
                };
                redis
                    .reconcile(key, &spec, &observed)
                    .await
                    .expect("reconcile");
                state::reconcile(reference.get(&spec, now), &spec, now, &observed);
            }
            Op::PenaltyLeft(cost) => {
                let got = redis
                    .wait_left(key, &spec, cost)
                    .await
                    .expect("penalty_left");
                let want = state::penalty_left(reference.get(&spec, now), &spec, now, cost);
                prop_assert_eq!(got, want, "penalty_left {:?} at {}", cost, now);
            }
        }
        compare(&leading, key, &spec, &mut reference, leading_clock.now()).await?;
    }
    Ok(())
}

/// Compares the state Redis holds with the reference's, as of `now`, the
/// leading replica's (the latest any replica reads). Redis drops the
/// buckets once every one is idle (`bucket::is_idle`: full, any penalty
/// passed), as the in-memory store's sweep does: from then on they are
/// fresh ones, and so are the reference's, which would otherwise remember
/// the end of a passed penalty (a later settle compares its booking's mark
/// with it) and the time they were dropped at.
async fn compare(
    redis: &RedisBackend,
    key: &str,
    spec: &LimitSpec,
    reference: &mut Reference,
    now: Micros,
) -> Result<(), TestCaseError> {
    let stored = redis.state(key).await.expect("read state");
    let Some(want) = &reference.state else {
        prop_assert!(
            stored.is_none(),
            "redis holds a state the reference never made"
        );
        return Ok(());
    };
    let stored = stored.unwrap_or(ResourceState {
        buckets: Vec::new(),
        leases: Vec::new(),
        penalty: 0,
    });
    // The penalty of a state of no bucket: Redis deletes the hash once a
    // call finds the penalty ended, after which the reference's ended
    // penalty is none either (a lagging replica's now may be before its
    // end). With buckets, neither has one.
    match (stored.penalty, spec.buckets.is_empty()) {
        (0, true) => {
            prop_assert!(
                want.penalty <= now,
                "redis lost a penalty the reference has: {}",
                want.penalty
            );
            reference.state.as_mut().unwrap().penalty = 0;
        }
        (penalty, _) => prop_assert_eq!(penalty, want.penalty, "the penalty"),
    }
    let want = reference.state.as_ref().unwrap();
    if stored.buckets.is_empty() {
        for ((_, p), s) in spec.buckets.iter().zip(&want.buckets) {
            prop_assert!(
                bucket::is_idle(s, p, now),
                "redis deleted a bucket the reference holds: {:?}",
                s
            );
        }
        reference.buckets_dropped = true;
    } else {
        for (((_, p), got), want) in spec.buckets.iter().zip(&stored.buckets).zip(&want.buckets) {
            prop_assert_eq!(normalized(got, p, now), normalized(want, p, now));
        }
    }
    prop_assert_eq!(sorted(stored.leases), sorted(want.leases.clone()));
    Ok(())
}

/// A redis-server of the test's own, and the runtime its cases run on.
fn server_and_runtime() -> (RedisServer, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (RedisServer::start(), rt)
}

/// A case: the limits, how far the lagging replica's clock is behind, and
/// the steps.
type Case = (LimitSpec, Micros, Vec<(Replica, Op)>);

/// Runs `PROPTEST_CASES` (else `cases`) random cases of `strategy`, each on
/// a key of its own.
fn run_random_cases(cases: u32, strategy: impl Strategy<Value = Case>) {
    let (server, rt) = server_and_runtime();
    let url = server.url();
    run_numbered(cases, &strategy, |n, (spec, lag, steps)| {
        let key = format!("case-{n}");
        rt.block_on(run_case(&url, &key, spec, lag, steps))
    });
}

#[test]
fn lua_scripts_decide_exactly_as_the_rust_reference() {
    run_random_cases(200, (spec(), Just(0), steps(Just(Replica::Leading))));
}

/// Two replicas whose clocks differ by up to 20 s, each operation issued by
/// either: the lagging one's now is clamped to the buckets' `ts`, and a penalty
/// it puts on lasts as long from `ts` (`bucket::on_bucket_time`).
#[test]
fn lua_scripts_decide_as_the_reference_on_replicas_with_lagging_clocks() {
    let replica = prop_oneof![Just(Replica::Leading), Just(Replica::Lagging)];
    run_random_cases(200, (spec(), lag(), steps(replica)));
}

/// Cases the random search found, run on every run.
#[test]
fn lua_scripts_decide_as_the_reference_in_found_cases() {
    let (server, rt) = server_and_runtime();
    let url = server.url();
    let one_bucket = |capacity: f64, amount: f64, period: f64| LimitSpec {
        buckets: vec![(Unit::Requests, BucketParams::new(capacity, amount, period))],
        max_concurrent: None,
        lease_ttl: 1_000,
    };
    let on_one_clock = |ops: Vec<Op>| ops.into_iter().map(|op| (Replica::Leading, op)).collect();
    let cases: [Case; 5] = [
        (
            // A refund after a penalty's end, settled for a booking due 1 µs
            // before now.
            one_bucket(1.0, 11.0, 1_000.0),
            0,
            on_one_clock(vec![
                Op::Penalize(713_513),
                Op::Advance(713_513),
                Op::Try(Cost::requests(0)),
                Op::Book(Cost::requests(1), 0),
                Op::Settle(Cost::requests(1), Cost::requests(0), Some(-1)),
            ]),
        ),
        (
            // A penalty from a replica 1 µs behind the bucket's ts (lasts its
            // 1 µs from ts; penalize.lua once ended it at ts).
            one_bucket(1.0, 1.0, 1_000.0),
            1,
            vec![
                (Replica::Leading, Op::Try(Cost::requests(1))),
                (Replica::Lagging, Op::Penalize(1)),
            ],
        ),
        (
            // Likewise a counter at 0 reported to that replica (reconcile.lua).
            one_bucket(2.0, 1.0, 1_000.0),
            1,
            vec![
                (Replica::Leading, Op::Try(Cost::requests(1))),
                (Replica::Lagging, Op::Reconcile(Some(0), None, Some(1))),
            ],
        ),
        (
            // A key denied at the leading replica's now (stored nothing), then
            // made fresh by the lagging one at its own, earlier now.
            one_bucket(1.0, 1.0, 1_000.0),
            1,
            vec![
                (Replica::Leading, Op::Try(Cost::requests(2))),
                (Replica::Lagging, Op::Try(Cost::requests(1))),
            ],
        ),
        (
            // A concurrency limit alone: a penalty goes on the state itself,
            // is never shortened, outlasts a slot's release, and is deleted
            // by the leading replica once it ends, while the lagging
            // replica's now is still before its end.
            LimitSpec {
                buckets: Vec::new(),
                max_concurrent: Some(1),
                lease_ttl: 2_000_000,
            },
            2_000_000,
            vec![
                (Replica::Leading, Op::Try(Cost::requests(1))),
                (Replica::Leading, Op::Penalize(3_000_000)),
                (Replica::Lagging, Op::Penalize(1_000_000)),
                (Replica::Lagging, Op::Try(Cost::requests(1))),
                (Replica::Leading, Op::Release(0)),
                (Replica::Leading, Op::Book(Cost::requests(1), 2_000_000)),
                (Replica::Leading, Op::Book(Cost::requests(1), 3_000_000)),
                (Replica::Leading, Op::Advance(3_000_000)),
                (Replica::Leading, Op::Try(Cost::requests(0))),
                (Replica::Leading, Op::Release(1)),
                (Replica::Lagging, Op::Try(Cost::requests(1))),
            ],
        ),
    ];
    for (n, (spec, lag, steps)) in cases.into_iter().enumerate() {
        rt.block_on(run_case(&url, &format!("found-{n}"), spec, lag, steps))
            .unwrap_or_else(|e| panic!("found case {n}: {e}"));
    }
}
