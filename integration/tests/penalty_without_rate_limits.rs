//! A 429 on a resource with a concurrency limit alone (no rate limit, so no
//! bucket for the store to drain and penalize): the store penalizes the state
//! itself, so every broker sharing the store waits the penalty out, not
//! only the one that got the 429. Two brokers on one in-memory store (in
//! tokio's paused time), and two replicas on one redis-server of the
//! test's own (on one manual client clock).

use std::sync::Arc;
use std::time::Duration;

mod penalty_support;

use broker_core::{
    Cost, DenyReason, EnqueueError, Limits, ManualClock, Observed, ObservedLimit, Outcome,
    ResourceBroker, ResourceConfig, RetryPolicy, Store, TokioClock,
};
use broker_memory::MemoryBackend;
use broker_testkit::RedisServer;
use penalty_support::{answered_429, denied_by_rate_for, replica};
use tokio::time::Instant;

/// Four slots, no rate limit; one attempt per call, so that a 429 ends
/// the call (its penalty is put on all the same).
fn config() -> ResourceConfig {
    ResourceConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..ResourceConfig::new(Limits::new().max_concurrent(4))
    }
}

/// Asserts that a call enqueued on `broker` now starts its work when a
/// penalty of `penalty` from `since` ends (in paused time, within 50 ms of it).
async fn starts_once_penalized_for(broker: &ResourceBroker, since: Instant, penalty: Duration) {
    let waited = enqueued_starts_after(broker, since).await;
    assert!(
        waited >= penalty && waited < penalty + Duration::from_millis(50),
        "started {waited:?} after the penalty began"
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
            ..Default::default()
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
async fn a_spent_counter_stops_every_broker_on_the_memory_store() {
    const RESET: Duration = Duration::from_secs(7);
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = ResourceBroker::from_arc(store.clone());
    let b = ResourceBroker::from_arc(store);
    a.register("llm", config()).unwrap();
    b.register("llm", config()).unwrap();
    let mut left = spent(RESET);
    left.requests.as_mut().unwrap().remaining = Some(3);
    a.enqueue("llm", Cost::default(), |_| {
        let left = left.clone();
        async move { Outcome::<(), ()>::ok(()).with_observed(left) }
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
    denied_by_rate_for(&b, RESET).await;
    // The broker that read the headers waits too, from its own penalty.
    starts_once_penalized_for(&a, at_reply, RESET).await;
    assert_eq!(a.stats().resources["llm"].upstream_429, 0);
}

/// `reconcile` with a spent counter on one replica holds the other on the
/// same redis-server until the reset (on their shared client clock).
#[tokio::test]
async fn a_spent_counter_stops_every_replica_on_redis() {
    const RESET: Duration = Duration::from_secs(30);
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let (a, b) = (
        replica(&server, &clock, config()).await,
        replica(&server, &clock, config()).await,
    );
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
async fn a_429_stops_every_broker_on_the_memory_store() {
    const RETRY_AFTER: Duration = Duration::from_secs(5);
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = ResourceBroker::from_arc(store.clone());
    let b = ResourceBroker::from_arc(store);
    a.register("llm", config()).unwrap();
    b.register("llm", config()).unwrap();
    let before = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert!(before.allowed, "no penalty before the 429");
    drop(before);
    answered_429(&a, RETRY_AFTER).await;
    let at_429 = Instant::now();
    denied_by_rate_for(&b, RETRY_AFTER).await;
    starts_once_penalized_for(&b, at_429, RETRY_AFTER).await;
    assert!(b.try_acquire("llm", Cost::default()).await.unwrap().allowed);
}

/// The other replica on the same redis-server: its `try_acquire` is denied
/// by rate with the wait to the penalty's end (the `Retry-After`, on the
/// replicas' shared client clock, which stands still until the test moves
/// it), and its `enqueue` books the call for that end and sleeps until it
/// before the work starts.
#[tokio::test]
async fn a_429_stops_every_replica_on_redis() {
    const RETRY_AFTER: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let (a, b) = (
        replica(&server, &clock, config()).await,
        replica(&server, &clock, config()).await,
    );
    let before = b.try_acquire("llm", Cost::default()).await.unwrap();
    assert!(before.allowed, "no penalty before the 429");
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

/// A call of the other broker that booked for the end of a penalty, while
/// a second 429 (a call in flight before the first) lengthens it: the
/// call waits for the longer end, not the one it booked for.
#[tokio::test(start_paused = true)]
async fn a_call_booked_for_the_end_of_a_penalty_waits_for_a_longer_one() {
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
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

/// The upstream's answer to a call.
type Answer = fn() -> Outcome<(), &'static str>;

/// How long after the upstream's `answer` to a call of one broker (on a
/// store that takes 100 ms to apply a penalty if `slow`; the call dropped
/// 50 ms after the answer, as by a timeout around `enqueue`, if `cut_off`)
/// a call of another broker on the same store, which waited for that
/// call's slot, starts its work.
async fn started_after_the_answer(slow: bool, cut_off: bool, answer: Answer) -> Duration {
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = Arc::new(ResourceBroker::from_arc(match slow {
        true => Arc::new(broker_testkit::Wrapped::new(store.clone(), SlowPenalty)),
        false => store.clone(),
    }));
    let b = Arc::new(ResourceBroker::from_arc(store));
    let one_slot = ResourceConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..ResourceConfig::new(Limits::new().max_concurrent(1))
    };
    a.register("llm", one_slot.clone()).unwrap();
    b.register("llm", one_slot).unwrap();
    let told = Arc::new(tokio::sync::Notify::new());
    // Cut off 50 ms after the answer, while the store applies its penalty.
    let limit = if cut_off {
        Duration::from_millis(151)
    } else {
        Duration::from_secs(3600)
    };
    let first = tokio::spawn({
        let (a, told) = (a.clone(), told.clone());
        let call = async move {
            a.enqueue("llm", Cost::default(), |_| {
                let told = told.clone();
                async move {
                    told.notified().await;
                    answer()
                }
            })
            .await
        };
        tokio::time::timeout(limit, call)
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
    let finished = first.await.unwrap().is_ok();
    assert_eq!(finished, !cut_off, "cut off as asked");
    waiting.await.unwrap() - at_answer
}

/// A call of the other broker waiting for the slot of a call that gets a
/// 429, or a success whose headers say the counter is spent: the slot
/// freed must not let the waiter start its work during the penalty the store
/// then has, neither on a store that applies the penalty at once nor on
/// one that takes a while (the penalty must reach it before the slot is
/// freed).
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_the_slot_starts_once_the_stores_penalty_ends() {
    let cases: [(&str, bool, Answer); 3] = [
        ("429", false, || {
            Outcome::rate_limited("429", Some(Duration::from_secs(5)))
        }),
        ("429, slow store", true, || {
            Outcome::rate_limited("429", Some(Duration::from_secs(5)))
        }),
        ("spent counter, slow store", true, || {
            Outcome::ok(()).with_observed(spent(Duration::from_secs(5)))
        }),
    ];
    for (what, slow, answer) in cases {
        let started = started_after_the_answer(slow, false, answer).await;
        assert!(
            started >= Duration::from_secs(5),
            "{what}: started {started:?} after the answer"
        );
    }
}

/// A call dropped after its answer while the store applies a 429's or a
/// spent counter's penalty: the penalty still reaches the store
/// before the call's slot is freed, so the other broker's call waiting
/// for the slot starts its work once the penalty ends.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_the_store_takes_its_penalty_frees_the_slot_after_it() {
    let cases: [(&str, Answer); 2] = [
        ("429", || {
            Outcome::rate_limited("429", Some(Duration::from_secs(5)))
        }),
        ("spent counter", || {
            Outcome::ok(()).with_observed(spent(Duration::from_secs(5)))
        }),
    ];
    for (what, answer) in cases {
        let started = started_after_the_answer(true, true, answer).await;
        assert!(
            started >= Duration::from_secs(5),
            "{what}: started {started:?} after the answer"
        );
    }
}

/// A 429 with retries left: the call's next attempt starts when the penalty
/// ends, waited for once (this process's penalty and the store's end
/// together), on a store that applies the penalty at once or a while
/// after; the 429 is counted once, the spent counter it reports
/// reconciled once.
#[tokio::test(start_paused = true)]
async fn a_retried_429_waits_for_its_penalty_once() {
    for slow in [false, true] {
        let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
        let broker = ResourceBroker::from_arc(match slow {
            true => Arc::new(broker_testkit::Wrapped::new(store, SlowPenalty)),
            false => store,
        });
        let two_attempts = ResourceConfig {
            retry: RetryPolicy {
                max_attempts: 2,
                ..RetryPolicy::default()
            },
            ..ResourceConfig::new(Limits::new().max_concurrent(1))
        };
        broker.register("llm", two_attempts).unwrap();
        let answered = std::sync::Mutex::new(None);
        let started = broker
            .enqueue("llm", Cost::default(), |attempt| {
                let answered = &answered;
                async move {
                    if attempt.number == 1 {
                        *answered.lock().unwrap() = Some(Instant::now());
                        return Outcome::rate_limited("429", Some(Duration::from_secs(5)))
                            .with_observed(spent(Duration::from_secs(3)));
                    }
                    Outcome::<Instant, &str>::ok(Instant::now())
                }
            })
            .await
            .unwrap();
        let waited = started - answered.lock().unwrap().unwrap();
        let delay = Duration::from_millis(if slow { 200 } else { 0 });
        assert!(
            waited >= Duration::from_secs(5) && waited <= Duration::from_secs(5) + delay,
            "slow {slow}: retried {waited:?} after the 429"
        );
        let stats = &broker.stats().resources["llm"];
        assert_eq!(
            (stats.upstream_429, stats.reconciles, stats.retries),
            (1, 1, 1),
            "slow {slow}"
        );
    }
}

/// A store whose `penalize` fails.
struct PenaltyFails;

impl broker_testkit::Hooks for PenaltyFails {
    fn penalize(&self) -> Option<Result<(), broker_core::BackendError>> {
        Some(Err(broker_core::BackendError::new("down")))
    }
}

/// A 429 whose penalty, and a spent counter whose penalty, the store fails
/// to take: the call ends with the upstream's answer (the 429 counted
/// once, the failures as backend errors) and frees its slot, which the
/// next call takes.
#[tokio::test(start_paused = true)]
async fn a_penalty_the_store_fails_to_take_frees_the_slot() {
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let broker =
        ResourceBroker::from_arc(Arc::new(broker_testkit::Wrapped::new(store, PenaltyFails)));
    let one_slot = ResourceConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..ResourceConfig::new(Limits::new().max_concurrent(1))
    };
    broker.register("llm", one_slot).unwrap();
    let r: Result<(), EnqueueError<&str>> = broker
        .enqueue("llm", Cost::default(), |_| async move {
            Outcome::rate_limited("429", Some(Duration::from_secs(5)))
                .with_observed(spent(Duration::from_secs(5)))
        })
        .await;
    assert!(
        matches!(r, Err(EnqueueError::RetriesExhausted { attempts: 1, .. })),
        "{r:?}"
    );
    let stats = &broker.stats().resources["llm"];
    assert_eq!(
        (
            stats.upstream_429,
            stats.reconciles,
            stats.in_flight,
            stats.queued
        ),
        (1, 0, 0, 0)
    );
    assert_eq!(
        stats.backend_errors, 2,
        "the penalty and the spent counter's penalty"
    );
    // This process's own penalty still keeps the next call until it ends.
    let at_429 = Instant::now();
    starts_once_penalized_for(&broker, at_429, Duration::from_secs(5)).await;
}
