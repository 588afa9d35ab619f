//! Random operation sequences driven through the Rust reference
//! (`broker_core::state`) and through the Lua scripts on a real
//! redis-server: every decision must be identical, and after every step the
//! stored state must equal the reference's (bit for bit, once both are
//! refilled to now; a key Redis deleted as idle must be idle in the
//! reference too).

use std::sync::Arc;
use std::time::Duration;

use broker_core::bucket::{self, BucketParams, BucketState};
use broker_core::state::{self, Lease, Marks, ResourceState};
use broker_core::{
    Backend, Clock, Cost, LimitSpec, ManualClock, Micros, Observed, ObservedLimit, Unit,
};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Try(Cost),
    Reserve(Cost, u64),
    HoldSlot,
    Release(usize),
    Renew(usize),
    /// Reserved, actual, and the booking's due time as an offset from now
    /// (in µs, may be negative), if given.
    Settle(Cost, Cost, Option<i64>),
    Penalize(u64),
    Reconcile(Option<u64>, Option<u64>, Option<u64>),
}

fn cost() -> impl Strategy<Value = Cost> {
    (0u64..4, 0u64..40).prop_map(|(requests, tokens)| Cost { requests, tokens })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![Just(1u64), Just(137), 0u64..3_000_000, Just(60_000_000)].prop_map(Op::Advance),
        4 => cost().prop_map(Op::Try),
        3 => (cost(), prop_oneof![Just(0u64), 0u64..5_000_000, Just(u64::MAX)])
            .prop_map(|(c, w)| Op::Reserve(c, w)),
        1 => Just(Op::HoldSlot),
        1 => (0usize..4).prop_map(Op::Release),
        1 => (0usize..4).prop_map(Op::Renew),
        1 => (cost(), cost(), prop::option::of(-5_000_000i64..5_000_000))
            .prop_map(|(a, b, at)| Op::Settle(a, b, at)),
        1 => (0u64..10_000_000).prop_map(Op::Penalize),
        1 => (prop::option::of(0u64..30), prop::option::of(0u64..60), prop::option::of(0u64..5_000_000))
            .prop_map(|(r, t, reset)| Op::Reconcile(r, t, reset)),
    ]
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

fn spec() -> impl Strategy<Value = LimitSpec> {
    (
        params(),
        prop::option::of(params()),
        prop::option::of(1u32..4),
        prop_oneof![Just(1_000u64), Just(2_000_000)],
    )
        .prop_map(|(requests, tokens, max_concurrent, lease_ttl)| {
            let mut buckets = vec![(Unit::Requests, requests)];
            buckets.extend(tokens.map(|p| (Unit::Tokens, p)));
            LimitSpec {
                buckets,
                max_concurrent,
                lease_ttl,
            }
        })
}

/// The reference's state, created fresh on first use like MemoryBackend.
struct Reference {
    state: Option<ResourceState>,
}

impl Reference {
    fn get(&mut self, spec: &LimitSpec, now: Micros) -> &mut ResourceState {
        self.state
            .get_or_insert_with(|| ResourceState::fresh(spec, now))
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

async fn run_case(
    url: &str,
    key: &str,
    spec: LimitSpec,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let redis = RedisBackend::builder(url)
        .client_time(Arc::new(clock.clone()))
        .ttl_margin(Duration::from_secs(600))
        .connect()
        .await
        .expect("connect");
    let mut reference = Reference { state: None };
    let mut held: Vec<u64> = Vec::new();
    for op in ops {
        let now = clock.now();
        match op {
            Op::Advance(us) => clock.advance(Duration::from_micros(us)),
            Op::Try(cost) => {
                let got = redis.try_acquire(key, &spec, cost).await.expect("try");
                let lease = got.lease.unwrap_or(0);
                let want = state::try_acquire(reference.get(&spec, now), &spec, now, cost, lease);
                prop_assert_eq!(got, want, "try {:?} at {}", cost, now);
                held.extend(got.lease);
            }
            Op::Reserve(cost, max_wait) => {
                let got = redis
                    .reserve(key, &spec, cost, Duration::from_micros(max_wait))
                    .await
                    .expect("reserve");
                let want = state::reserve(reference.get(&spec, now), &spec, now, cost, max_wait);
                prop_assert_eq!(
                    got,
                    want,
                    "reserve {:?} within {} at {}",
                    cost,
                    max_wait,
                    now
                );
            }
            Op::HoldSlot => {
                let got = redis.hold_slot(key, &spec).await.expect("hold_slot");
                let lease = got.unwrap_or(0);
                let want = state::hold_slot(reference.get(&spec, now), &spec, now, lease);
                prop_assert_eq!(got.is_some(), want, "hold_slot at {}", now);
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
                let want = reference
                    .state
                    .as_mut()
                    .is_some_and(|s| state::renew(s, &spec, now, lease));
                prop_assert_eq!(got, want, "renew {} at {}", lease, now);
            }
            Op::Settle(reserved, actual, at) => {
                let booked = at.map(|d| Marks::uniform(now.saturating_add_signed(d)));
                redis
                    .settle(key, &spec, reserved, actual, booked)
                    .await
                    .expect("settle");
                let state = reference.get(&spec, now);
                state::settle(state, &spec, now, reserved, actual, booked);
            }
            Op::Penalize(hold) => {
                redis
                    .penalize(key, &spec, Duration::from_micros(hold))
                    .await
                    .expect("penalize");
                state::penalize(reference.get(&spec, now), &spec, now, now + hold);
            }
            Op::Reconcile(requests, tokens, reset) => {
                let observed = ObservedLimit {
                    requests: Some(Observed {
                        limit: None,
                        remaining: requests,
                        reset: reset.map(Duration::from_micros),
                    }),
                    tokens: tokens.map(|t| Observed {
                        limit: None,
                        remaining: Some(t),
                        reset: reset.map(Duration::from_micros),
                    }),
                    retry_after: None,
                };
                redis
                    .reconcile(key, &spec, &observed)
                    .await
                    .expect("reconcile");
                state::reconcile(reference.get(&spec, now), &spec, now, &observed);
            }
        }
        compare(&redis, key, &spec, &mut reference, clock.now()).await?;
    }
    Ok(())
}

/// Compares the state Redis holds with the reference's. Redis drops the
/// buckets once every one is idle (`bucket::is_idle`: full, any hold
/// passed), as the in-memory store's sweep does: from then on they are
/// fresh ones, and so are the reference's, which would otherwise remember
/// the end of a passed hold (a later settle compares its booking's mark
/// with it).
async fn compare(
    redis: &RedisBackend,
    key: &str,
    spec: &LimitSpec,
    reference: &mut Reference,
    now: Micros,
) -> Result<(), TestCaseError> {
    let stored = redis.state(key).await.expect("read state");
    let Some(want) = &mut reference.state else {
        prop_assert!(
            stored.is_none(),
            "redis holds a state the reference never made"
        );
        return Ok(());
    };
    let stored = stored.unwrap_or(ResourceState {
        buckets: Vec::new(),
        leases: Vec::new(),
    });
    if stored.buckets.is_empty() {
        for ((_, p), s) in spec.buckets.iter().zip(&want.buckets) {
            prop_assert!(
                bucket::is_idle(s, p, now),
                "redis deleted a bucket the reference holds: {:?}",
                s
            );
        }
        want.buckets = ResourceState::fresh(spec, now).buckets;
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

#[test]
fn lua_scripts_decide_exactly_as_the_rust_reference() {
    let (server, rt) = server_and_runtime();
    let url = server.url();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(
            &(spec(), prop::collection::vec(op(), 1..40)),
            |(spec, ops)| {
                let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let key = format!("case-{n}");
                rt.block_on(run_case(&url, &key, spec, ops))
            },
        )
        .unwrap();
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
    let cases = [(
        // A refund after a penalty's end, settled for a booking due 1 µs
        // before now.
        one_bucket(1.0, 11.0, 1_000.0),
        vec![
            Op::Penalize(713_513),
            Op::Advance(713_513),
            Op::Try(Cost::requests(0)),
            Op::Reserve(Cost::requests(1), 0),
            Op::Settle(Cost::requests(1), Cost::requests(0), Some(-1)),
        ],
    )];
    for (n, (spec, ops)) in cases.into_iter().enumerate() {
        rt.block_on(run_case(&url, &format!("found-{n}"), spec, ops))
            .unwrap_or_else(|e| panic!("found case {n}: {e}"));
    }
}
