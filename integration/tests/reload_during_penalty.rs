//! A configuration reload while an upstream's 429 holds a resource, to
//! limits with another number of rate limits (a tokens-per-minute limit
//! added beside the requests-per-second one, or the rate limits dropped
//! for a concurrency limit alone): the store's state cannot keep its
//! buckets, but it keeps the penalty (`state::adopt`), so no broker that
//! reloads lets a call through before the upstream said it may come.
//! Two brokers on one in-memory store (in tokio's paused time), and two
//! replicas on one redis-server of the test's own (on one manual client
//! clock).

use std::sync::Arc;
use std::time::Duration;

mod penalty_support;

use broker_core::{
    Cost, Limits, ManualClock, RateLimit, ResourceBroker, ResourceConfig, RetryPolicy, Store,
    TokioClock, Unit,
};
use broker_memory::MemoryBackend;
use broker_testkit::RedisServer;
use penalty_support::{answered_429, denied_by_rate_for, replica};

const RETRY_AFTER: Duration = Duration::from_secs(5);

/// `limits`, one attempt per call, so that a 429 ends the call (its
/// penalty is put on all the same).
fn config(limits: Limits) -> ResourceConfig {
    ResourceConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..ResourceConfig::new(limits)
    }
}

/// The limits before the reload: 10 requests a second.
fn before() -> ResourceConfig {
    config(Limits::new().rate(RateLimit::per_second(10)))
}

/// The limits after: the reloads the test makes, in turn.
fn reloads() -> [ResourceConfig; 3] {
    let tpm = RateLimit::per_minute(100_000).unit(Unit::Tokens);
    [
        config(Limits::new().rate(RateLimit::per_second(10)).rate(tpm)),
        config(Limits::new().max_concurrent(4)),
        before(),
    ]
}

/// `b` reloads to each of [`reloads`] while `a`'s 429 holds the resource:
/// each reload is denied until the penalty's end (`elapsed` moves the
/// store's clock by 1 s), then admitted.
async fn every_reload_keeps_the_penalty(
    a: &ResourceBroker,
    b: &ResourceBroker,
    elapsed: impl AsyncFn(Duration),
) {
    let warm = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert!(warm.allowed, "no penalty before the 429");
    drop(warm);
    answered_429(a, RETRY_AFTER).await;
    let mut left = RETRY_AFTER;
    for config in reloads() {
        b.register("llm", config).unwrap();
        denied_by_rate_for(b, left).await;
        elapsed(Duration::from_secs(1)).await;
        left -= Duration::from_secs(1);
    }
    denied_by_rate_for(a, left).await;
    elapsed(left).await;
    assert!(b.try_acquire("llm", Cost::default()).await.unwrap().allowed);
    assert!(a.try_acquire("llm", Cost::default()).await.unwrap().allowed);
}

#[tokio::test(start_paused = true)]
async fn a_reload_on_the_memory_store_keeps_the_penalty() {
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = ResourceBroker::from_arc(store.clone());
    let b = ResourceBroker::from_arc(store);
    a.register("llm", before()).unwrap();
    b.register("llm", before()).unwrap();
    every_reload_keeps_the_penalty(&a, &b, async |d| tokio::time::sleep(d).await).await;
}

#[tokio::test]
async fn a_reload_on_redis_keeps_the_penalty() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let (a, b) = (
        replica(&server, &clock, before()).await,
        replica(&server, &clock, before()).await,
    );
    every_reload_keeps_the_penalty(&a, &b, async |d| clock.advance(d)).await;
}
