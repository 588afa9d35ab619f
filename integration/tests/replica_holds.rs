//! A 429 (a penalty) one replica gets holds the calls another replica has
//! already booked, on a resource with rate limits: when such a call wakes
//! for its booked time, or gets the slot it waited for, it asks the store
//! for a penalty put on since, and waits it out instead of going out during
//! the penalty. Two brokers on
//! one in-memory store (in tokio's paused time), and two replicas on one
//! redis-server of the test's own (on one manual client clock).

mod penalty_support;

use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Cost, EnqueueError, Limits, ManualClock, Outcome, RateLimit, ResourceBroker, ResourceConfig,
    RetryPolicy, Store, TokioClock,
};
use broker_memory::MemoryBackend;
use broker_testkit::RedisServer;
use penalty_support::replica;
use tokio::time::Instant;

/// Two a second, a burst of one: a second call books half a second out.
fn config() -> ResourceConfig {
    ResourceConfig::new(Limits::new().rate(RateLimit::per_second(2).with_burst(1)))
}

/// Runs one call on `broker`'s `llm`; its work answers `at()` as it starts.
async fn started_at<T: Send + 'static>(
    broker: &ResourceBroker,
    at: impl Fn() -> T + Send + Sync + 'static,
) -> T {
    let at = Arc::new(at);
    broker
        .enqueue("llm", Cost::default(), move |_| {
            let at = at.clone();
            async move { Outcome::<T, ()>::ok(at()) }
        })
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_call_booked_on_one_broker_waits_for_a_penalty_another_puts_on() {
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = ResourceBroker::from_arc(store.clone());
    let b = ResourceBroker::from_arc(store);
    a.register("llm", config()).unwrap();
    b.register("llm", config()).unwrap();
    let t0 = Instant::now();
    assert_eq!(started_at(&b, Instant::now).await, t0, "the burst");
    let booked = {
        let b = b.clone();
        tokio::spawn(async move { started_at(&b, Instant::now).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Broker a's call got a 429 with Retry-After: 2 s, at 0.1 s.
    a.penalize("llm", Duration::from_secs(2)).await.unwrap();
    let started = booked.await.unwrap() - t0;
    assert!(
        started >= Duration::from_millis(2100),
        "booked for 0.5 s, started {started:?} after 0, inside the penalty (0.1 s to 2.1 s)"
    );
}

/// The same on Redis: replica b's call, booked for 0.5 s on the shared
/// clock, wakes while the penalty replica a put on holds the bucket, and
/// starts only once the store's clock has passed the penalty's end.
#[tokio::test]
async fn a_call_booked_on_one_replica_waits_for_a_penalty_another_puts_on() {
    const PENALTY: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let (a, b) = (
        replica(&server, &clock, config()).await,
        replica(&server, &clock, config()).await,
    );
    let now = {
        let clock = clock.clone();
        move || broker_core::Clock::now(&clock)
    };
    let t0 = now();
    assert_eq!(started_at(&b, now.clone()).await, t0, "the burst");
    let booked = {
        let (b, now) = (b.clone(), now.clone());
        tokio::spawn(async move { started_at(&b, now).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.penalize("llm", PENALTY).await.unwrap();
    // The booked call wakes (0.5 s, real time) with the store's clock still
    // at the penalty's start; the clock passes its end a while after.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!booked.is_finished(), "started inside the penalty");
    clock.advance(PENALTY);
    let started = booked.await.unwrap();
    assert!(
        started >= t0 + PENALTY.as_micros() as u64,
        "started at {} µs on the store's clock, inside the penalty",
        started - t0
    );
}

/// A call of broker b waits for the one slot, which broker a's call holds;
/// that call gets a 429 (Retry-After 2 s), penalizes the store and frees
/// the slot. Broker b's call, given the slot, waits the penalty out too,
/// as a call of broker a would (see `admit_until`), also when the penalty
/// takes a while to reach the store: it reaches it before the slot is
/// freed.
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_slot_waits_for_the_penalty_of_the_call_that_held_it() {
    let answer = || Outcome::rate_limited("429", Some(Duration::from_secs(2)));
    for slow in [false, true] {
        let (started, result) = slot_freed_by(slow.then_some(SlowPenalty), answer).await;
        assert!(
            matches!(result, Err(EnqueueError::RetriesExhausted { .. })),
            "{result:?}"
        );
        assert!(
            started >= Duration::from_secs(2),
            "a store slow to take the penalty: {slow}; started {started:?} after the 429, \
             inside its 2 s penalty"
        );
    }
}

/// A store across a network: a penalty reaches it a while after it is
/// sent.
struct SlowPenalty;

impl broker_testkit::Hooks for SlowPenalty {
    fn correction_delay(&self) -> Duration {
        Duration::from_millis(100)
    }
}

/// A call of broker b waits for the one slot, which broker a's call holds;
/// that call succeeds, and the upstream's headers say its request counter
/// is spent for 2 s. Broker b's call, given the slot, waits for the
/// counter too, also when the reconcile takes a while to reach the store:
/// it reaches it before the slot is freed (after the settlement of the
/// success). Before, the slot was freed first, and a call waiting for it
/// went out into the spent window.
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_slot_waits_for_the_counter_the_call_that_held_it_saw_spent() {
    use broker_core::{Observed, ObservedLimit};
    let spent = ObservedLimit {
        requests: Some(Observed {
            limit: Some(100),
            remaining: Some(0),
            reset: Some(Duration::from_secs(2)),
            ..Default::default()
        }),
        ..ObservedLimit::default()
    };
    let answer = move || Outcome::Ok {
        value: (),
        usage: None,
        observed: Some(spent.clone()),
    };
    let (started, result) = slot_freed_by(Some(SlowReconcile), answer).await;
    result.unwrap();
    assert!(
        started >= Duration::from_secs(2),
        "started {started:?} after the answer, inside the 2 s the counter is spent"
    );
}

/// A store across a network: a reconcile reaches it a while after it is
/// sent.
struct SlowReconcile;

impl broker_testkit::Hooks for SlowReconcile {
    fn reconcile_delay(&self) -> Duration {
        Duration::from_millis(100)
    }
}

/// How long after broker a's call got `answer` (its one attempt) broker
/// b's call, which waited for its slot, starts its work, and what broker
/// a's call returned. Broker a's store is wrapped in `hooks`, if any.
async fn slot_freed_by<H: broker_testkit::Hooks>(
    hooks: Option<H>,
    answer: impl Fn() -> Outcome<(), &'static str> + Send + Sync + 'static,
) -> (Duration, Result<(), EnqueueError<&'static str>>) {
    let store: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let a = ResourceBroker::from_arc(match hooks {
        Some(hooks) => Arc::new(broker_testkit::Wrapped::new(store.clone(), hooks)),
        None => store.clone(),
    });
    let b = ResourceBroker::from_arc(store);
    let config = ResourceConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..ResourceConfig::new(
            Limits::new()
                .rate(RateLimit::per_second(100).with_burst(10))
                .max_concurrent(1),
        )
    };
    a.register("llm", config.clone()).unwrap();
    b.register("llm", config).unwrap();
    let go = Arc::new(tokio::sync::Notify::new());
    let holder = {
        let (go, answer) = (go.clone(), Arc::new(answer));
        tokio::spawn(async move {
            a.enqueue("llm", Cost::default(), |_| {
                let (go, answer) = (go.clone(), answer.clone());
                async move {
                    go.notified().await;
                    answer()
                }
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiting = tokio::spawn(async move { started_at(&b, Instant::now).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let at_answer = Instant::now();
    go.notify_one();
    let result = holder.await.unwrap();
    (waiting.await.unwrap() - at_answer, result)
}
