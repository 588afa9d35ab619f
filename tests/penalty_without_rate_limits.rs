//! A 429 on a resource with a concurrency limit alone (no rate limit, so no
//! bucket for the store to drain and hold): the store holds the state
//! itself, so every broker sharing the store waits the penalty out, not
//! only the one that got the 429. Two brokers on one in-memory store (in
//! tokio's paused time), and two replicas on one redis-server of the
//! test's own (on one manual client clock).

use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Backend, Cost, DenyReason, EnqueueError, Limits, ManualClock, Observed, ObservedLimit, Outcome,
    ResourceBroker, ResourceConfig, RetryPolicy, TokioClock,
};
use broker_memory::MemoryBackend;
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;
use tokio::time::Instant;

/// Four slots, no rate limit; one attempt per call, so that a 429 ends
/// the call (its penalty is put on all the same).
fn config() -> ResourceConfig {
    ResourceConfig::new(Limits::new().max_concurrent(4)).retry(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    })
}

/// One call on `broker` that the upstream answers 429 with `retry_after`.
async fn answered_429(broker: &ResourceBroker, retry_after: Duration) {
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

/// A spent counter (`remaining` 0, reset in `reset`), as an upstream's
/// rate-limit headers give it.
fn spent(reset: Duration) -> ObservedLimit {
    ObservedLimit {
        requests: Some(Observed {
            limit: Some(100),
            remaining: Some(0),
            reset: Some(reset),
        }),
        ..ObservedLimit::default()
    }
}

/// How long after `since` a call enqueued on `broker` now starts its work.
async fn enqueued_starts_after(broker: &ResourceBroker, since: Instant) -> Duration {
    let started = broker
        .enqueue("llm", Cost::default(), |_| async move {
            Outcome::<Instant, ()>::ok(Instant::now())
        })
        .await
        .unwrap();
    started - since
}

/// A success whose headers say the upstream's counter is spent holds the
/// state in the store until the reset, as a 429 does: the other broker
/// waits for it too, and no 429 is counted. A counter with requests left
/// holds nothing.
#[tokio::test(start_paused = true)]
async fn a_spent_counter_holds_every_broker_on_the_memory_store() {
    const RESET: Duration = Duration::from_secs(7);
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = ResourceBroker::from_arc(store.clone());
    let b = ResourceBroker::from_arc(store);
    a.register("llm", config()).unwrap();
    b.register("llm", config()).unwrap();
    let mut left = spent(RESET);
    left.requests.as_mut().unwrap().remaining = Some(3);
    a.enqueue("llm", Cost::default(), |_| async move {
        Outcome::<(), ()>::ok(()).with_observed(left)
    })
    .await
    .unwrap();
    assert!(b.try_acquire("llm", Cost::default()).await.unwrap().allowed);
    a.enqueue("llm", Cost::default(), |_| async move {
        Outcome::<(), ()>::ok(()).with_observed(spent(RESET))
    })
    .await
    .unwrap();
    let at_reply = Instant::now();
    let d = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by, d.wait_time),
        (false, Some(DenyReason::Rate), RESET)
    );
    // The broker that read the headers waits too, from its own hold.
    let waited = enqueued_starts_after(&a, at_reply).await;
    assert!(
        waited >= RESET && waited < RESET + Duration::from_millis(50),
        "started {waited:?} after the reply"
    );
    assert_eq!(a.stats().resources["llm"].upstream_429, 0);
}

/// `reconcile` with a spent counter on one replica holds the other on the
/// same redis-server until the reset (on their shared client clock).
#[tokio::test]
async fn a_spent_counter_holds_every_replica_on_redis() {
    const RESET: Duration = Duration::from_secs(30);
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let replica = || async {
        let backend = RedisBackend::builder(&server.url())
            .client_time(Arc::new(clock.clone()))
            .connect()
            .await
            .expect("connect to the test's redis-server");
        let broker = ResourceBroker::new(backend);
        broker.register("llm", config()).unwrap();
        broker
    };
    let (a, b) = (replica().await, replica().await);
    a.reconcile("llm", &spent(RESET)).await.unwrap();
    let d = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by, d.wait_time),
        (false, Some(DenyReason::Rate), RESET)
    );
    clock.advance(RESET);
    assert!(b.try_acquire("llm", Cost::default()).await.unwrap().allowed);
}

/// The other broker on the same in-memory store: its `try_acquire` is
/// denied by rate with the wait to the penalty's end (the `Retry-After`),
/// and its `enqueue` starts the work when the penalty ends.
#[tokio::test(start_paused = true)]
async fn a_429_holds_every_broker_on_the_memory_store() {
    const RETRY_AFTER: Duration = Duration::from_secs(5);
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = ResourceBroker::from_arc(store.clone());
    let b = ResourceBroker::from_arc(store);
    a.register("llm", config()).unwrap();
    b.register("llm", config()).unwrap();
    let before = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert!(before.allowed, "no hold before the 429");
    drop(before);
    answered_429(&a, RETRY_AFTER).await;
    let at_429 = Instant::now();
    let d = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by, d.wait_time),
        (false, Some(DenyReason::Rate), RETRY_AFTER)
    );
    let waited = enqueued_starts_after(&b, at_429).await;
    assert!(
        waited >= RETRY_AFTER && waited < RETRY_AFTER + Duration::from_millis(50),
        "started {waited:?} after the 429"
    );
    assert!(b.try_acquire("llm", Cost::default()).await.unwrap().allowed);
}

/// The other replica on the same redis-server: its `try_acquire` is denied
/// by rate with the wait to the penalty's end (the `Retry-After`, on the
/// replicas' shared client clock, which stands still until the test moves
/// it), and its `enqueue` books the call for that end and sleeps until it
/// before the work starts.
#[tokio::test]
async fn a_429_holds_every_replica_on_redis() {
    const RETRY_AFTER: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let replica = || async {
        let backend = RedisBackend::builder(&server.url())
            .client_time(Arc::new(clock.clone()))
            .connect()
            .await
            .expect("connect to the test's redis-server");
        let broker = ResourceBroker::new(backend);
        broker.register("llm", config()).unwrap();
        broker
    };
    let (a, b) = (replica().await, replica().await);
    let before = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert!(before.allowed, "no hold before the 429");
    drop(before);
    answered_429(&a, RETRY_AFTER).await;
    let at_429 = Instant::now();
    let d = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert_eq!(
        (d.allowed, d.denied_by, d.wait_time),
        (false, Some(DenyReason::Rate), RETRY_AFTER)
    );
    // The store's clock reaches the penalty's end while the call sleeps
    // for its booking: the store, asked again when it wakes, holds it no
    // longer.
    let (waited, ()) = tokio::join!(enqueued_starts_after(&b, at_429), async {
        tokio::time::sleep(RETRY_AFTER / 2).await;
        clock.advance(RETRY_AFTER);
    });
    assert!(waited >= RETRY_AFTER, "started {waited:?} after the 429");
    let stats = &b.stats().resources["llm"];
    assert_eq!(stats.local_waits, 1, "the call waited for its booking");
    assert!(b.try_acquire("llm", Cost::default()).await.unwrap().allowed);
}

/// A call of the other broker already waiting for the slot when the 429
/// comes: the slot freed by the call that got it must not let the waiter
/// start its work during the penalty the store holds.
#[tokio::test(start_paused = true)]
async fn a_429_holds_a_call_of_another_broker_waiting_for_the_slot() {
    const RETRY_AFTER: Duration = Duration::from_secs(5);
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = Arc::new(ResourceBroker::from_arc(store.clone()));
    let b = Arc::new(ResourceBroker::from_arc(store));
    let one_slot = ResourceConfig::new(Limits::new().max_concurrent(1)).retry(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    });
    a.register("llm", one_slot.clone()).unwrap();
    b.register("llm", one_slot).unwrap();
    let answer = Arc::new(tokio::sync::Notify::new());
    let first = tokio::spawn({
        let (a, told) = (a.clone(), answer.clone());
        async move {
            let r: Result<(), EnqueueError<&str>> = a
                .enqueue("llm", Cost::default(), |_| {
                    let told = told.clone();
                    async move {
                        told.notified().await;
                        Outcome::rate_limited("429", Some(RETRY_AFTER))
                    }
                })
                .await;
            r
        }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.enqueue("llm", Cost::default(), |_| async move {
                Outcome::<Instant, ()>::ok(Instant::now())
            })
            .await
            .unwrap()
        }
    });
    // The other broker's call books, then waits for the slot.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the slot is held");
    answer.notify_one();
    let at_429 = Instant::now();
    assert!(matches!(
        first.await.unwrap(),
        Err(EnqueueError::RetriesExhausted { attempts: 1, .. })
    ));
    let started = waiting.await.unwrap();
    assert!(
        started - at_429 >= RETRY_AFTER,
        "started {:?} after the 429",
        started - at_429
    );
}

/// A call of the other broker that booked for the end of a penalty, while
/// a second 429 (a call in flight before the first) lengthens it: the
/// call waits for the longer end, not the one it booked for.
#[tokio::test(start_paused = true)]
async fn a_call_booked_for_the_end_of_a_penalty_waits_for_a_longer_one() {
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = Arc::new(ResourceBroker::from_arc(store.clone()));
    let b = ResourceBroker::from_arc(store);
    a.register("llm", config()).unwrap();
    b.register("llm", config()).unwrap();
    let in_flight = |retry_after: Duration| {
        let (a, answer) = (a.clone(), Arc::new(tokio::sync::Notify::new()));
        let told = answer.clone();
        let call = tokio::spawn(async move {
            let r: Result<(), EnqueueError<&str>> = a
                .enqueue("llm", Cost::default(), |_| {
                    let told = told.clone();
                    async move {
                        told.notified().await;
                        Outcome::rate_limited("429", Some(retry_after))
                    }
                })
                .await;
            assert!(
                matches!(r, Err(EnqueueError::RetriesExhausted { attempts: 1, .. })),
                "{r:?}"
            );
        });
        (call, answer)
    };
    let (first, first_answer) = in_flight(Duration::from_secs(5));
    let (second, second_answer) = in_flight(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(1)).await;
    first_answer.notify_one();
    first.await.unwrap();
    let at_429 = Instant::now();
    let booked = tokio::spawn(async move {
        b.enqueue("llm", Cost::default(), |_| async move {
            Outcome::<Instant, ()>::ok(Instant::now())
        })
        .await
        .unwrap()
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!booked.is_finished(), "held by the first 429");
    second_answer.notify_one();
    second.await.unwrap();
    let started = booked.await.unwrap();
    assert!(
        started - at_429 >= Duration::from_secs(11),
        "started {:?} after the first 429",
        started - at_429
    );
}

/// A store across a network: a penalty reaches it a while after it is
/// sent.
struct SlowPenalty;

impl broker_testkit::Hooks for SlowPenalty {
    fn correction_delay(&self) -> Duration {
        Duration::from_millis(100)
    }
}

/// How long after the upstream's `answer` to a call of one broker (whose
/// store takes a while to apply a penalty) a call of another broker, which
/// waited for that call's slot, starts its work.
async fn started_after_the_answer(answer: fn() -> Outcome<(), &'static str>) -> Duration {
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let slow: Arc<dyn Backend> = Arc::new(broker_testkit::Wrapped::new(store.clone(), SlowPenalty));
    let a = Arc::new(ResourceBroker::from_arc(slow));
    let b = Arc::new(ResourceBroker::from_arc(store));
    let one_slot = ResourceConfig::new(Limits::new().max_concurrent(1)).retry(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    });
    a.register("llm", one_slot.clone()).unwrap();
    b.register("llm", one_slot).unwrap();
    let told = Arc::new(tokio::sync::Notify::new());
    let first = tokio::spawn({
        let (a, told) = (a.clone(), told.clone());
        async move {
            a.enqueue("llm", Cost::default(), |_| {
                let told = told.clone();
                async move {
                    told.notified().await;
                    answer()
                }
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.enqueue("llm", Cost::default(), |_| async move {
                Outcome::<Instant, ()>::ok(Instant::now())
            })
            .await
            .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the slot is held");
    told.notify_one();
    let at_answer = Instant::now();
    let _ = first.await.unwrap();
    waiting.await.unwrap() - at_answer
}

/// The broker that got the 429 frees its slot: a call of the other broker
/// waiting for that slot must not take it before the penalty reaches the
/// store, and go out during the penalty.
#[tokio::test(start_paused = true)]
async fn the_slot_of_a_429_is_freed_once_the_store_holds_the_penalty() {
    let started =
        started_after_the_answer(|| Outcome::rate_limited("429", Some(Duration::from_secs(5))))
            .await;
    assert!(
        started >= Duration::from_secs(5),
        "started {started:?} after the 429"
    );
}

/// Likewise for a success whose headers say the counter is spent: the
/// store holds the state before the slot is freed.
#[tokio::test(start_paused = true)]
async fn the_slot_of_a_call_that_spent_the_counter_is_freed_once_the_store_holds_it() {
    let started =
        started_after_the_answer(|| Outcome::ok(()).with_observed(spent(Duration::from_secs(5))))
            .await;
    assert!(
        started >= Duration::from_secs(5),
        "started {started:?} after the answer"
    );
}
