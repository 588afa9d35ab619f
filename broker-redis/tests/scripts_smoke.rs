//! Every script runs on a real server and answers as the reference does on
//! the simplest cases (the full comparison is the root conformance suite).

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Cost, LimitSpec, Limits, ManualClock, RateLimit, Store};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;

fn spec() -> LimitSpec {
    let limits = Limits::new()
        .rate(RateLimit::per_second(2).with_burst(3))
        .max_concurrent(2);
    LimitSpec::new(&limits, Duration::from_secs(30))
}

#[tokio::test]
async fn every_script_runs_and_takes_effect() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000);
    let b = RedisBackend::builder(&server.url())
        .client_time(Arc::new(clock.clone()))
        .connect()
        .await
        .unwrap();
    let spec = spec();
    let d1 = b.try_acquire("k", &spec, Cost::default()).await.unwrap();
    let d2 = b.try_acquire("k", &spec, Cost::default()).await.unwrap();
    assert!(d1.allowed && d2.allowed);
    let d3 = b.try_acquire("k", &spec, Cost::default()).await.unwrap();
    assert!(!d3.allowed, "two slots held");
    assert!(b.release("k", d1.lease.unwrap()).await.unwrap());
    assert!(
        !b.release("k", d1.lease.unwrap()).await.unwrap(),
        "idempotent"
    );
    let r = b
        .book("k", &spec, Cost::default(), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(r.booked);
    assert_eq!(r.wait, 0);
    let r = b
        .book("k", &spec, Cost::default(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.wait, 500_000);
    b.settle("k", &spec, Cost::requests(1), Cost::requests(0), None)
        .await
        .unwrap();
    b.penalize("k", &spec, Duration::from_secs(5))
        .await
        .unwrap();
    b.reconcile("k", &spec, &Default::default()).await.unwrap();
    let lease = b.take_slot("k", &spec).await.unwrap();
    assert!(lease.is_some());
    let state = b.state("k").await.unwrap().unwrap();
    assert_eq!(state.buckets[0].nb, 6_000_000);
    assert_eq!(state.buckets[0].tokens, 0.0);
    assert_eq!(state.leases.len(), 2);
}
