//! What the penalty tests share: replicas on one redis-server, a 429 on
//! the resource `llm`, and the denial it leaves.

#![allow(dead_code)] // Each test file uses its own part.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Cost, DenyReason, EnqueueError, ManualClock, Outcome, ResourceBroker, ResourceConfig,
};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;

/// One call on `broker` that the upstream answers 429 with `retry_after`;
/// the resource allows one attempt per call, so the 429 ends the call
/// (its penalty is put on all the same).
pub async fn answered_429(broker: &ResourceBroker, retry_after: Duration) {
    let r: Result<(), EnqueueError<&str>> = broker
        .enqueue("llm", Cost::default(), |_| async move {
            Outcome::rate_limited("429", Some(retry_after))
        })
        .await;
    assert!(
        matches!(r, Err(EnqueueError::RetriesExhausted { attempts: 1, .. })),
        "{r:?}"
    );
}

/// Asserts that `broker`'s `try_acquire` on `llm` is denied by rate, with
/// `wait`.
pub async fn denied_by_rate_for(broker: &ResourceBroker, wait: Duration) {
    let d = broker.try_acquire("llm", Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by, d.wait_time),
        (false, Some(DenyReason::Rate), wait),
        "limits {:?}",
        broker.limits("llm")
    );
}

/// A replica on `server`, on the client clock `clock` that every replica
/// of the test shares, with `llm` registered under `config`.
pub async fn replica(
    server: &RedisServer,
    clock: &ManualClock,
    config: ResourceConfig,
) -> ResourceBroker {
    let backend = RedisBackend::builder(&server.url())
        .client_time(Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect to the test's redis-server");
    let broker = ResourceBroker::new(backend);
    broker.register("llm", config).unwrap();
    broker
}
