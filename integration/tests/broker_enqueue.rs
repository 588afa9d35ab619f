//! Queue + execute on the in-memory backend, in tokio's paused time.

use broker_testkit::Lcg;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::{
    BrokerError, Cost, EnqueueError, Limits, Outcome, OutcomeClass, RateLimit, ResourceBroker,
    ResourceConfig, RetryPolicy, TokioClock, Unit,
};
use broker_memory::MemoryBackend;
use tokio::time::Instant;

fn broker() -> ResourceBroker {
    ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()))
}

/// A broker on the in-memory store that fails every penalty (an upstream
/// 429 the store failed to take): only this process's penalty applies.
fn broker_missing_penalties() -> ResourceBroker {
    struct NoPenalty;
    impl broker_testkit::Hooks for NoPenalty {
        fn penalize(&self) -> Option<Result<(), broker_core::BackendError>> {
            Some(Err(broker_core::BackendError::new("store unreachable")))
        }
    }
    let store = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    ResourceBroker::new(broker_testkit::Wrapped::new(store, NoPenalty))
}

fn seed_limits() -> Limits {
    Limits::new().rate(RateLimit::per(2, Duration::from_secs(1)).with_burst(3))
}

/// How many calls `try_acquire` lets through on `api` now, one after
/// another until the first denial.
async fn passing(broker: &ResourceBroker) -> usize {
    broker_testkit::allowed_in_a_row(broker, "api").await
}

type Started = Arc<Mutex<Vec<(String, Duration)>>>;

#[tokio::test(start_paused = true)]
async fn enqueue_runs_jobs_at_their_booked_times_in_order() {
    let broker = broker();
    broker
        .register("api", ResourceConfig::new(seed_limits()))
        .unwrap();
    let t0 = Instant::now();
    let started: Started = Default::default();
    let mut jobs = Vec::new();
    for job in 0..4 {
        for worker in ["A", "B"] {
            let (broker, started) = (broker.clone(), started.clone());
            let name = format!("{worker}{job}");
            jobs.push(tokio::spawn(async move {
                broker
                    .enqueue("api", Cost::default(), |_| {
                        let (started, name) = (started.clone(), name.clone());
                        async move {
                            started.lock().unwrap().push((name, t0.elapsed()));
                            Outcome::<(), ()>::ok(())
                        }
                    })
                    .await
            }));
            tokio::task::yield_now().await;
        }
    }
    for j in jobs {
        j.await.unwrap().unwrap();
    }
    let started = started.lock().unwrap().clone();
    let times: Vec<u128> = started.iter().map(|(_, t)| t.as_millis()).collect();
    assert_eq!(times, [0, 0, 0, 500, 1000, 1500, 2000, 2500]);
    let order: Vec<&str> = started.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order, ["A0", "B0", "A1", "B1", "A2", "B2", "A3", "B3"]);
    let stats = &broker.stats().resources["api"];
    assert_eq!((stats.completed, stats.queued, stats.in_flight), (8, 0, 0));
    assert_eq!(stats.local_waits, 5);
}

#[tokio::test(start_paused = true)]
async fn full_queue_answers_queue_full_at_once() {
    let broker = broker();
    let config = ResourceConfig {
        queue_capacity: 2,
        ..ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(1)))
    };
    broker.register("slow", config).unwrap();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let broker = broker.clone();
        waiting.push(tokio::spawn(async move {
            broker
                .enqueue("slow", Cost::default(), |_| async {
                    Outcome::<(), ()>::ok(())
                })
                .await
        }));
        tokio::task::yield_now().await;
    }
    // The first ran at once; two wait for the next minute and fill the queue.
    assert_eq!(broker.stats().resources["slow"].queued, 2);
    let t = Instant::now();
    let err = broker
        .enqueue("slow", Cost::default(), |_| async {
            Outcome::<(), ()>::ok(())
        })
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        EnqueueError::Broker(BrokerError::QueueFull { capacity: 2, .. })
    ));
    assert_eq!(t.elapsed(), Duration::ZERO);
    for w in waiting {
        w.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_enqueue_futures_refund_their_booking_and_free_their_slot() {
    let mut rng = Lcg(7);
    for round in 0..25 {
        let broker = broker();
        let limits = Limits::new()
            .rate(RateLimit::per_second(1).with_burst(2))
            .max_concurrent(2);
        broker.register("r", ResourceConfig::new(limits)).unwrap();
        let jobs = 2 + rng.next(10) as usize;
        let mut handles = Vec::new();
        for _ in 0..jobs {
            let broker = broker.clone();
            let work_ms = rng.next(3000);
            handles.push(tokio::spawn(async move {
                broker
                    .enqueue("r", Cost::default(), move |_| async move {
                        tokio::time::sleep(Duration::from_millis(work_ms)).await;
                        Outcome::<(), ()>::ok(())
                    })
                    .await
            }));
        }
        let cancel_at = Duration::from_millis(rng.next(8000));
        tokio::time::sleep(cancel_at).await;
        for h in &handles {
            h.abort();
        }
        for h in handles {
            let _ = h.await;
        }
        let stats = &broker.stats().resources["r"];
        assert_eq!(
            (stats.queued, stats.in_flight),
            (0, 0),
            "round {round}: counters leaked"
        );
        // Every unstarted booking was given back as far as no later
        // one was granted (x/time/rate's `Reservation.Cancel`): no debt is
        // left past the last booked time (at most `jobs - 2` s), so a
        // token is free a second later, and both concurrency slots are
        // free.
        tokio::time::sleep(Duration::from_secs(jobs as u64)).await;
        let a = broker.try_acquire("r", Cost::default()).await.unwrap();
        assert!(
            a.allowed,
            "round {round}: booking leaked (jobs {jobs}, cancel at {cancel_at:?})"
        );
        let b = broker
            .acquire("r", Cost::default(), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(b.allowed, "round {round}: slot or token leaked");
    }
}

#[tokio::test(start_paused = true)]
async fn actual_token_usage_is_settled_after_the_work() {
    let broker = broker();
    let limits = Limits::new()
        .rate(RateLimit::per_minute(100))
        .rate(RateLimit::per_minute(1000).unit(Unit::Tokens));
    broker.register("llm", ResourceConfig::new(limits)).unwrap();
    broker
        .enqueue("llm", Cost::tokens(800), |_| async {
            Outcome::<(), ()>::ok_with_usage((), Cost::tokens(300))
        })
        .await
        .unwrap();
    // 1000 - 300 = 700 tokens left; without settle only 200 would be.
    assert!(
        broker
            .try_acquire("llm", Cost::tokens(650))
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !broker
            .try_acquire("llm", Cost::tokens(100))
            .await
            .unwrap()
            .allowed
    );
}

#[tokio::test(start_paused = true)]
async fn upstream_429_penalizes_the_bucket_for_everyone_and_is_retried() {
    let broker = broker();
    broker
        .register(
            "api",
            ResourceConfig::new(Limits::new().rate(RateLimit::per_second(10))),
        )
        .unwrap();
    let t0 = Instant::now();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let task = {
        let (broker, attempts) = (broker.clone(), attempts.clone());
        tokio::spawn(async move {
            broker
                .enqueue("api", Cost::default(), |attempt| {
                    let attempts = attempts.clone();
                    async move {
                        attempts.lock().unwrap().push(t0.elapsed());
                        if attempt.number == 1 {
                            Outcome::rate_limited("429", Some(Duration::from_secs(2)))
                        } else {
                            Outcome::ok(attempt.number)
                        }
                    }
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let other = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(!other.allowed, "the penalty protects every other consumer");
    assert_eq!(task.await.unwrap().unwrap(), 2);
    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(attempts[0], Duration::ZERO);
    assert!(
        attempts[1] >= Duration::from_secs(2),
        "retried after Retry-After: {attempts:?}"
    );
    let stats = &broker.stats().resources["api"];
    assert_eq!(
        (stats.upstream_429, stats.retries, stats.completed),
        (1, 1, 1)
    );
}

/// A 429 on the last attempt still penalizes the bucket, though no retry
/// follows: the next run of the job (or any other consumer) must not start
/// into the upstream's closed window.
#[tokio::test(start_paused = true)]
async fn a_429_on_the_last_attempt_still_penalizes_the_bucket() {
    let broker = broker();
    let retry = RetryPolicy {
        max_attempts: 2,
        ..RetryPolicy::default()
    };
    let limits = Limits::new().rate(RateLimit::per_second(10));
    broker
        .register(
            "api",
            ResourceConfig {
                retry,
                ..ResourceConfig::new(limits)
            },
        )
        .unwrap();
    let t0 = Instant::now();
    let err = broker
        .enqueue("api", Cost::default(), |_| async {
            Outcome::<(), _>::rate_limited("429", Some(Duration::from_secs(5)))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EnqueueError::RetriesExhausted {
                attempts: 2,
                last: OutcomeClass::RateLimited,
                ..
            }
        ),
        "{err:?}"
    );
    // The second attempt ran after the first one's 5 s pause; its own 429
    // holds the bucket for another Retry-After, though the budget is spent.
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
    let after = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(!after.allowed, "the last 429 holds the bucket");
    assert_eq!(after.wait_time, Duration::from_secs(5));
    assert_eq!(broker.stats().resources["api"].upstream_429, 2);
}

#[tokio::test(start_paused = true)]
async fn fatal_errors_are_not_retried_and_an_empty_budget_is_its_own_error() {
    let broker = broker();
    let retry = RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    let config = ResourceConfig {
        retry,
        ..ResourceConfig::new(Limits::new().rate(RateLimit::per_second(10)))
    };
    broker.register("api", config).unwrap();
    let fatal = broker
        .enqueue("api", Cost::default(), |_| async {
            Outcome::<(), _>::failed(OutcomeClass::Fatal, "401", None)
        })
        .await
        .unwrap_err();
    assert!(matches!(
        fatal,
        EnqueueError::Fatal {
            attempts: 1,
            error: "401"
        }
    ));
    let exhausted = broker
        .enqueue("api", Cost::default(), |_| async {
            Outcome::<(), _>::failed(OutcomeClass::Transient, "503", None)
        })
        .await
        .unwrap_err();
    assert!(matches!(
        exhausted,
        EnqueueError::RetriesExhausted {
            attempts: 3,
            last: OutcomeClass::Transient,
            ..
        }
    ));
    let stats = &broker.stats().resources["api"];
    assert_eq!((stats.retries_exhausted, stats.failed), (1, 2));
}

/// The work's own error, say an upstream's 401, stays with the error
/// `enqueue` returns: in its message and as its `source()`, through `?`
/// into a `Box<dyn Error>`.
#[tokio::test(start_paused = true)]
async fn the_work_error_is_the_source_and_in_the_message() {
    use std::error::Error;

    #[derive(Debug)]
    struct ApiError;
    impl std::fmt::Display for ApiError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("401 invalid api key")
        }
    }
    impl Error for ApiError {}

    async fn call(broker: &ResourceBroker, class: OutcomeClass) -> Result<(), Box<dyn Error>> {
        broker
            .enqueue("api", Cost::default(), |_| async move {
                Outcome::<(), _>::failed(class, ApiError, None)
            })
            .await?;
        Ok(())
    }

    let broker = broker();
    let retry = RetryPolicy {
        max_attempts: 2,
        ..RetryPolicy::default()
    };
    let config = ResourceConfig {
        retry,
        ..ResourceConfig::new(Limits::new().rate(RateLimit::per_second(10)))
    };
    broker.register("api", config).unwrap();
    for (class, says) in [
        (OutcomeClass::Fatal, "fatal upstream error on attempt 1"),
        (
            OutcomeClass::Transient,
            "retry budget exhausted after 2 attempts",
        ),
    ] {
        let e = call(&broker, class).await.unwrap_err();
        let message = e.to_string();
        assert!(message.contains(says), "{message}");
        assert!(message.contains("401 invalid api key"), "{message}");
        let source = e.source().expect("the work's error as the source");
        assert!(source.is::<ApiError>(), "{source:?}");
        assert_eq!(source.to_string(), "401 invalid api key");
    }
}

#[tokio::test(start_paused = true)]
async fn a_released_slot_wakes_a_waiting_enqueue_at_once() {
    let broker = broker();
    let limits = Limits::new()
        .rate(RateLimit::per_second(1000))
        .max_concurrent(1);
    broker
        .register("one-slot", ResourceConfig::new(limits))
        .unwrap();
    let mut held = broker
        .try_acquire("one-slot", Cost::default())
        .await
        .unwrap();
    assert!(held.allowed && held.permit.is_held());
    let start = Instant::now();
    let waiter = {
        let broker = broker.clone();
        tokio::spawn(async move {
            broker
                .enqueue("one-slot", Cost::default(), |_| async {
                    Outcome::<Duration, ()>::ok(start.elapsed())
                })
                .await
        })
    };
    // The waiter is parked on the slot; release it 3 ms later, well inside
    // the 25 ms re-check interval: the work must start at 3 ms.
    tokio::time::sleep(Duration::from_millis(3)).await;
    held.permit.release();
    let started_after = waiter.await.unwrap().unwrap();
    assert_eq!(started_after, Duration::from_millis(3));
}

/// The send times (ms) of `jobs` calls of `enqueue` on "api", started in
/// order; the first `holding` of them keep their work (and slot) until
/// `until` after the start; `meanwhile` runs while they wait.
async fn send_times(
    broker: &ResourceBroker,
    jobs: usize,
    (holding, until): (usize, Duration),
    meanwhile: impl std::future::Future<Output = ()>,
) -> Vec<u128> {
    let t0 = Instant::now();
    let log: Arc<Mutex<Vec<u128>>> = Arc::default();
    let mut running = Vec::new();
    for i in 0..jobs {
        let (b, log) = (broker.clone(), log.clone());
        running.push(tokio::spawn(async move {
            b.enqueue("api", Cost::default(), |_| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push(t0.elapsed().as_millis());
                    if i < holding {
                        tokio::time::sleep_until(t0 + until).await;
                    }
                    Outcome::<(), ()>::ok(())
                }
            })
            .await
        }));
        tokio::task::yield_now().await;
    }
    meanwhile.await;
    for job in running {
        job.await.unwrap().unwrap();
    }
    let times = log.lock().unwrap().clone();
    times
}

fn spaced_a_second_apart(times: &[u128]) -> bool {
    times.windows(2).all(|w| w[1] >= w[0] + 1000)
}

/// Calls booked at spaced times and then held by a penalty leave spaced
/// after it, not all at its end.
#[tokio::test(start_paused = true)]
async fn calls_held_by_a_penalty_leave_spaced_when_it_ends() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_second(1));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let penalty = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        broker
            .penalize("api", Duration::from_secs(10))
            .await
            .unwrap();
    };
    let times = send_times(&broker, 5, (0, Duration::ZERO), penalty).await;
    assert_eq!(times[0], 0);
    assert!(times[1] >= 10_500, "held to the penalty's end: {times:?}");
    assert!(spaced_a_second_apart(&times), "{times:?}");
}

/// A call booked before a penalty longer than its wait ceiling ends at the
/// ceiling, with `WaitTooLong`, as a call made during the penalty does.
#[tokio::test(start_paused = true)]
async fn a_penalty_beyond_the_ceiling_ends_a_booked_call_at_the_ceiling() {
    for penalty in [Duration::from_secs(3600), Duration::MAX] {
        let broker = broker();
        let limits = Limits::new().rate(RateLimit::per_second(1));
        broker.register("api", ResourceConfig::new(limits)).unwrap();
        let ok = |_| async { Outcome::<(), ()>::ok(()) };
        broker.enqueue("api", Cost::default(), ok).await.unwrap();
        let t0 = Instant::now();
        let b = broker.clone();
        let booked = tokio::spawn(async move {
            let r = b.enqueue("api", Cost::default(), ok).await;
            (t0.elapsed(), r)
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        broker.penalize("api", penalty).await.unwrap();
        let (after, result) = booked.await.unwrap();
        assert!(
            matches!(
                result,
                Err(EnqueueError::Broker(BrokerError::WaitTooLong { .. }))
            ),
            "{result:?}"
        );
        assert!(after <= Duration::from_secs(61), "{penalty:?}: {after:?}");
    }
}

/// Calls cancelled while they wait for the only slot, across a penalty,
/// leave the bucket as if they had never been made: their bookings are not
/// given back under the penalty, so nothing it drained comes back.
#[tokio::test(start_paused = true)]
async fn calls_cancelled_across_a_penalty_do_not_widen_the_bucket() {
    async fn allowed_after_the_penalty(cancelled: usize) -> usize {
        let broker = broker();
        let limits = Limits::new()
            .rate(RateLimit::per_second(1).with_burst(5))
            .max_concurrent(1);
        broker.register("api", ResourceConfig::new(limits)).unwrap();
        let held = broker.try_acquire("api", Cost::default()).await.unwrap();
        assert!(held.allowed);
        let mut calls = Vec::new();
        for _ in 0..cancelled {
            let b = broker.clone();
            calls.push(tokio::spawn(async move {
                let ok = |_| async { Outcome::<(), ()>::ok(()) };
                b.enqueue("api", Cost::default(), ok).await
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        broker
            .penalize("api", Duration::from_secs(2))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        for call in calls {
            call.abort();
            let _ = call.await;
        }
        drop(held);
        // The penalty ends at 2.5 s.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        passing(&broker).await
    }
    let baseline = allowed_after_the_penalty(0).await;
    assert_eq!(allowed_after_the_penalty(4).await, baseline);
}

/// A call that waits out a penalty longer than a slot's lease TTL (90 s
/// against 60 s, within the 121 s ceiling) takes its slot only once it
/// can go: a second call never runs beside it on `max_concurrent(1)`.
#[tokio::test(start_paused = true)]
async fn a_long_penalty_wait_does_not_outlive_the_slot() {
    let broker = broker();
    let limits = Limits::new()
        .rate(RateLimit::per_minute(60))
        .max_concurrent(1);
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    broker
        .penalize("api", Duration::from_secs(90))
        .await
        .unwrap();
    let running = Arc::new(Mutex::new((0usize, 0usize)));
    let call = || {
        let (b, running) = (broker.clone(), running.clone());
        async move {
            b.enqueue("api", Cost::default(), |_| {
                let running = running.clone();
                async move {
                    {
                        let mut r = running.lock().unwrap();
                        r.0 += 1;
                        r.1 = r.1.max(r.0);
                    }
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    running.lock().unwrap().0 -= 1;
                    Outcome::<(), ()>::ok(())
                }
            })
            .await
        }
    };
    let first = tokio::spawn(call());
    tokio::time::sleep(Duration::from_secs(61)).await;
    let second = tokio::spawn(call());
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(running.lock().unwrap().1, 1, "max_concurrent(1) breached");
}

/// A call ended by a backend error counts as failed, and leaves nothing
/// queued or in flight.
#[tokio::test]
async fn an_enqueue_ended_by_a_backend_error_is_counted_failed() {
    let broker = ResourceBroker::new(broker_testkit::DownBackend::new("down"));
    let limits = Limits::new().rate(RateLimit::per_second(1));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let ok = |_| async { Outcome::<(), ()>::ok(()) };
    let result = broker.enqueue("api", Cost::default(), ok).await;
    assert!(
        matches!(result, Err(EnqueueError::Broker(BrokerError::Backend(_)))),
        "{result:?}"
    );
    let stats = &broker.stats().resources["api"];
    assert_eq!((stats.failed, stats.queued, stats.in_flight), (1, 0, 0));
}

/// A call booked under a penalty that another broker put on the shared
/// store (so this broker holds nothing locally), for after the penalty,
/// and cancelled while it waits: its cost is given back in full (the
/// penalty's drain left it as booked debt), so the bucket comes out of the
/// penalty as if the call had never been made.
#[tokio::test(start_paused = true)]
async fn a_call_booked_under_another_brokers_penalty_is_given_back_when_cancelled() {
    struct Shared;
    impl broker_testkit::Hooks for Shared {}
    let store = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let on_store = || ResourceBroker::new(broker_testkit::Wrapped::new(store.clone(), Shared));
    let (a, b) = (on_store(), on_store());
    let limits = || Limits::new().rate(RateLimit::per_second(1).with_burst(10));
    a.register("api", ResourceConfig::new(limits())).unwrap();
    b.register("api", ResourceConfig::new(limits())).unwrap();
    a.penalize("api", Duration::from_secs(2)).await.unwrap();
    // Booked for 5 s (five tokens at one a second), past the penalty.
    let call = tokio::spawn(async move {
        let ok = |_| async { Outcome::<(), ()>::ok(()) };
        b.enqueue("api", Cost::requests(5), ok).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    // 2.5 s after the drain: 2.5 tokens, as without the call.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(passing(&a).await, 2);
}

/// Issue 39: burst 1, 10 a second, three calls at once (sent at 0, 100
/// and 200 ms); the 100 ms one dropped at 50 ms; a call at 60 ms is sent at
/// 300 ms, not at 200 ms beside the third (a strict upstream's 429).
#[tokio::test(start_paused = true)]
async fn a_dropped_call_does_not_let_a_later_one_go_beside_another() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_second(10).with_burst(1));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let t0 = Instant::now();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let call = |name: &'static str| {
        let (broker, sent) = (broker.clone(), sent.clone());
        tokio::spawn(async move {
            let work = |_| {
                sent.lock().unwrap().push((name, t0.elapsed().as_millis()));
                async { Outcome::<(), ()>::ok(()) }
            };
            broker.enqueue("api", Cost::default(), work).await
        })
    };
    let first = call("first");
    tokio::task::yield_now().await;
    let dropped = call("dropped");
    tokio::task::yield_now().await;
    let third = call("third");
    tokio::time::sleep(Duration::from_millis(50)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let late = call("late");
    for c in [first, third, late] {
        c.await.unwrap().unwrap();
    }
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent, [("first", 0), ("third", 200), ("late", 300)]);
}

/// A call booked 10 s ahead, then a 1 s penalty that ends before the call
/// is due, then the call cancelled: no more passes when the penalty ends
/// than without the call (1). Giving its cost back would undo the
/// penalty's drain (the booking's debt hid the tokens the drain should
/// have taken): 9 would pass. The cost stays spent instead, so 0 pass:
/// a refund after a later penalty is refused whole, even the part of it the
/// drain did not take.
#[tokio::test(start_paused = true)]
async fn a_call_cancelled_after_a_shorter_penalty_does_not_undo_its_drain() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_second(1).with_burst(10));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let all = broker.try_acquire("api", Cost::requests(10)).await.unwrap();
    assert!(all.allowed);
    let b = broker.clone();
    let call = tokio::spawn(async move {
        let ok = |_| async { Outcome::<(), ()>::ok(()) };
        b.enqueue("api", Cost::requests(10), ok).await
    });
    tokio::time::sleep(Duration::from_secs(8)).await;
    broker
        .penalize("api", Duration::from_secs(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let allowed = passing(&broker).await;
    assert!(allowed <= 1, "{allowed} passed, 1 without the call");
}

/// Work that runs longer than the resource's `lease_ttl` keeps its slot
/// on the in-memory store: with one slot, calls of 90 s each never run
/// two at a time.
#[tokio::test(start_paused = true)]
async fn work_longer_than_the_lease_ttl_keeps_its_slot() {
    let broker = broker();
    let json = r#"{ "limits": { "maxConcurrentRequests": 1 }, "retry": { "waitCeiling": "10m" } }"#;
    let config: ResourceConfig =
        broker_core::config::parse("llm.json", json, broker_core::config::Format::Json).unwrap();
    assert_eq!(config.lease_ttl, Duration::from_secs(60));
    broker.register("llm", config).unwrap();
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calls = (0..3).map(|_| {
        let (broker, running, most) = (broker.clone(), running.clone(), most.clone());
        tokio::spawn(async move {
            broker
                .enqueue("llm", Cost::default(), move |_| {
                    let (running, most) = (running.clone(), most.clone());
                    async move {
                        use std::sync::atomic::Ordering::SeqCst;
                        let now = running.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        tokio::time::sleep(Duration::from_secs(90)).await;
                        running.fetch_sub(1, SeqCst);
                        Outcome::<(), ()>::ok(())
                    }
                })
                .await
        })
    });
    let calls: Vec<_> = calls.collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// How many `try_acquire` on `("api", "t")` pass now, one after another.
async fn drained(broker: &ResourceBroker) -> usize {
    let mut n = 0;
    while broker
        .try_acquire(("api", "t"), Cost::default())
        .await
        .unwrap()
        .allowed
    {
        n += 1;
    }
    n
}

/// Ten calls a minute on `("api", "t")`, all taken, and an `enqueue` on
/// it waiting for its booked time; then `limits` registered in turn (each
/// with other buckets than the one before, so each starts the state
/// afresh: 10 pass again), and the waiting call cancelled. How many calls
/// pass after that.
async fn passing_after_a_cancelled_call_outlived(limits: &[Limits]) -> usize {
    let broker = broker();
    let ten = Limits::new().rate(RateLimit::per_minute(10));
    broker.register("api", ResourceConfig::new(ten)).unwrap();
    assert_eq!(drained(&broker).await, 10);
    let waiting = broker.clone();
    let old = tokio::spawn(async move {
        waiting
            .enqueue(("api", "t"), Cost::default(), |_| async {
                Outcome::<(), ()>::ok(())
            })
            .await
    });
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    for l in limits {
        broker
            .register("api", ResourceConfig::new(l.clone()))
            .unwrap();
        assert_eq!(drained(&broker).await, 10, "other buckets: a fresh state");
    }
    old.abort();
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    drained(&broker).await
}

/// A call that began under a registration replaced by one with other
/// buckets makes its later transitions with the new limits: its refund
/// does not make the state start afresh again (for the old limits), and
/// the new registration's next call does not either. Before, each swap of
/// limits refilled the bucket: 30 calls passed a limit of 10 a minute.
#[tokio::test(start_paused = true)]
async fn a_call_from_a_replaced_registration_does_not_refill_the_new_one() {
    let ten = Limits::new().rate(RateLimit::per_minute(10));
    let with_tokens = ten.rate(RateLimit::per_minute(1000).unit(Unit::Tokens));
    let passing = passing_after_a_cancelled_call_outlived(&[with_tokens]).await;
    assert_eq!(passing, 0, "the old call's refund refilled it");
}

/// A booking made under limits A, refunded after A was replaced by B
/// (other buckets) and B by C (A's limits again): the state was started
/// afresh twice since and holds none of its cost, so nothing is refunded.
#[tokio::test(start_paused = true)]
async fn a_refund_after_the_limits_went_and_came_back_is_not_made() {
    let ten = Limits::new().rate(RateLimit::per_minute(10));
    let with_tokens = ten
        .clone()
        .rate(RateLimit::per_minute(1000).unit(Unit::Tokens));
    let passing = passing_after_a_cancelled_call_outlived(&[with_tokens, ten]).await;
    assert_eq!(passing, 0, "the old call's refund refilled it");
}

/// A call refused because its cost can never fit ended in an error:
/// counted as failed.
#[tokio::test(start_paused = true)]
async fn a_cost_that_never_fits_is_counted_as_failed() {
    let broker = broker();
    broker
        .register("api", ResourceConfig::new(seed_limits()))
        .unwrap();
    let err = broker
        .enqueue("api", Cost::requests(4), |_| async {
            Outcome::<(), ()>::ok(())
        })
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        EnqueueError::Broker(BrokerError::CostNeverFits { .. })
    ));
    assert_eq!(broker.stats().resources["api"].failed, 1);
}

/// A call refused because the queue is full ended in an error: counted
/// as failed.
#[tokio::test(start_paused = true)]
async fn a_queue_full_refusal_is_counted_as_failed() {
    let broker = broker();
    let config = ResourceConfig {
        queue_capacity: 1,
        ..ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(1)))
    };
    broker.register("slow", config).unwrap();
    let ok = |_| async { Outcome::<(), ()>::ok(()) };
    broker.enqueue("slow", Cost::default(), ok).await.unwrap();
    let b = broker.clone();
    let waiting = tokio::spawn(async move { b.enqueue("slow", Cost::default(), ok).await });
    tokio::task::yield_now().await;
    let err = broker
        .enqueue("slow", Cost::default(), ok)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        EnqueueError::Broker(BrokerError::QueueFull { .. })
    ));
    let stats = broker.stats().resources["slow"].clone();
    assert_eq!((stats.completed, stats.failed, stats.queued), (1, 1, 1));
    waiting.abort();
}

/// The queue stays bounded across a re-registration: the calls still
/// waiting on the replaced registration fill the resource's queue, so the
/// same config registered again does not make room for as many more
/// (before, 4 calls waited in a queue of 2, and `stats()` said so).
#[tokio::test(start_paused = true)]
async fn a_re_registration_does_not_make_room_in_a_full_queue() {
    let broker = broker();
    let config = || {
        let limits = Limits::new().rate(RateLimit::per_minute(10).with_burst(1));
        ResourceConfig {
            queue_capacity: 2,
            ..ResourceConfig::new(limits)
        }
    };
    broker.register("slow", config()).unwrap();
    let ok = |_| async { Outcome::<(), ()>::ok(()) };
    broker.enqueue("slow", Cost::default(), ok).await.unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let b = broker.clone();
            tokio::spawn(async move { b.enqueue("slow", Cost::default(), ok).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(broker.stats().resources["slow"].queued, 2);
    broker.register("slow", config()).unwrap();
    let err = broker
        .enqueue("slow", Cost::default(), ok)
        .await
        .unwrap_err();
    assert!(
        matches!(err, EnqueueError::Broker(BrokerError::QueueFull { .. })),
        "{err:?}"
    );
    assert_eq!(broker.stats().resources["slow"].queued, 2);
    for call in waiting {
        call.abort();
    }
}

/// The total wait counts the time waited: a call dropped one second into
/// a minute's wait adds one second.
#[tokio::test(start_paused = true)]
async fn a_dropped_wait_counts_the_time_it_waited() {
    let broker = broker();
    let config = ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(1)));
    broker.register("slow", config).unwrap();
    let ok = |_| async { Outcome::<(), ()>::ok(()) };
    broker.enqueue("slow", Cost::default(), ok).await.unwrap();
    let b = broker.clone();
    let waiting = tokio::spawn(async move { b.enqueue("slow", Cost::default(), ok).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    waiting.abort();
    let _ = waiting.await;
    let stats = broker.stats().resources["slow"].clone();
    assert_eq!((stats.local_waits, stats.total_wait_ms), (1, 1_000));
    // A wait to its end counts in full: 59 s more to the next token.
    broker.enqueue("slow", Cost::default(), ok).await.unwrap();
    let stats = broker.stats().resources["slow"].clone();
    assert_eq!((stats.local_waits, stats.total_wait_ms), (2, 60_000));
}

/// A call waiting for the only slot while the call holding it gets a 429
/// was booked before the 429: it waits the penalty out too, instead of
/// taking the slot the 429'd call frees and going out during the penalty.
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_slot_waits_out_a_429_of_the_call_holding_it() {
    let broker = broker();
    let limits = Limits::new()
        .rate(RateLimit::per_second(10))
        .max_concurrent(1);
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let t0 = Instant::now();
    let sends: Arc<Mutex<Vec<(usize, u32, Duration)>>> = Arc::default();
    let call = |id: usize| {
        let (b, sends) = (broker.clone(), sends.clone());
        async move {
            b.enqueue("api", Cost::default(), |attempt| {
                let sends = sends.clone();
                async move {
                    let at = t0.elapsed();
                    sends.lock().unwrap().push((id, attempt.number, at));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if id == 0 && attempt.number == 1 {
                        Outcome::rate_limited("429", Some(Duration::from_secs(5)))
                    } else {
                        Outcome::<(), &str>::ok(())
                    }
                }
            })
            .await
        }
    };
    let first = tokio::spawn(call(0));
    tokio::task::yield_now().await;
    let second = tokio::spawn(call(1));
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    let sends = sends.lock().unwrap().clone();
    assert_eq!(sends[0], (0, 1, Duration::ZERO), "{sends:?}");
    // The 429 came back at 100 ms and holds the resource until 5.1 s.
    for &(id, attempt, at) in &sends[1..] {
        assert!(
            at >= Duration::from_millis(5100),
            "call {id}, attempt {attempt} went out at {at:?}, during the penalty: {sends:?}"
        );
    }
}

/// A store whose settlements and penalties take a second to arrive (a
/// store across a network).
struct SlowCorrections;

impl broker_testkit::Hooks for SlowCorrections {
    fn correction_delay(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// An `enqueue` given up by a timeout around it while its settlement is on
/// its way still charges the usage above its estimate. Before, the
/// settlement was cut off with the call: 90 tokens used, 10 charged.
#[tokio::test(start_paused = true)]
async fn a_settlement_cut_off_by_a_timeout_is_still_made() {
    let store = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let broker = ResourceBroker::new(broker_testkit::Wrapped::new(store, SlowCorrections));
    let limits = Limits::new().rate(RateLimit::per_minute(100).unit(Unit::Tokens));
    broker.register_limit("api", limits).unwrap();
    let used = |_| async { Outcome::<(), ()>::ok_with_usage((), Cost::tokens(90)) };
    let call = broker.enqueue("api", Cost::tokens(10), used);
    let cut = tokio::time::timeout(Duration::from_millis(500), call).await;
    assert!(
        cut.is_err(),
        "the timeout cuts the call off during its settlement"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    // 90 charged and about 4 refilled: 14 tokens, not 50.
    let left = broker.try_acquire("api", Cost::tokens(50)).await.unwrap();
    assert!(!left.allowed, "usage above the estimate went uncharged");
    let some = broker.try_acquire("api", Cost::tokens(10)).await.unwrap();
    assert!(some.allowed);
}

/// An `enqueue` given up by a timeout around it while the penalty of its
/// upstream 429 is on its way to the shared store still penalizes the
/// store, so another broker on it holds off too. Before, the penalty was
/// cut off with the call, and the other broker went on sending.
#[tokio::test(start_paused = true)]
async fn a_penalty_cut_off_by_a_timeout_still_reaches_the_store() {
    let store = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let on_store = || {
        let broker =
            ResourceBroker::new(broker_testkit::Wrapped::new(store.clone(), SlowCorrections));
        let limits = Limits::new().rate(RateLimit::per_second(10));
        broker.register_limit("api", limits).unwrap();
        broker
    };
    let (a, b) = (on_store(), on_store());
    let refused =
        |_| async { Outcome::<(), &str>::rate_limited("429", Some(Duration::from_secs(10))) };
    let call = a.enqueue("api", Cost::default(), refused);
    let cut = tokio::time::timeout(Duration::from_millis(500), call).await;
    assert!(
        cut.is_err(),
        "the timeout cuts the call off during its penalty"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let other = b.try_acquire("api", Cost::default()).await.unwrap();
    assert!(!other.allowed, "the store was never penalized");
}

/// A call whose work used less than its estimate, finished after another
/// call's upstream 429 that the store failed to take as a penalty: the
/// unused estimate stays spent, as this process's penalty says (as a
/// cancelled booking's does), instead of going back to the bucket the
/// upstream just refused. Before, 40 tokens went back.
#[tokio::test(start_paused = true)]
async fn a_success_after_a_429_the_store_missed_gives_nothing_back() {
    let broker = broker_missing_penalties();
    let limits = Limits::new().rate(RateLimit::per_minute(100).unit(Unit::Tokens));
    broker.register_limit("api", limits).unwrap();
    let (refused_tx, refused_rx) = tokio::sync::oneshot::channel::<()>();
    let refused_rx = Arc::new(Mutex::new(Some(refused_rx)));
    let long = broker.enqueue("api", Cost::tokens(50), |_| {
        let refused = refused_rx.lock().unwrap().take();
        async move {
            if let Some(refused) = refused {
                refused.await.unwrap();
            }
            Outcome::<(), &str>::ok_with_usage((), Cost::tokens(10))
        }
    });
    let mut refused_tx = Some(refused_tx);
    let short = broker.enqueue("api", Cost::tokens(10), |attempt| {
        let refused = refused_tx.take();
        async move {
            if attempt.number > 1 {
                return Outcome::ok(());
            }
            let out = Outcome::rate_limited("429", Some(Duration::from_millis(500)));
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                refused.unwrap().send(()).unwrap();
            });
            out
        }
    });
    let (long, short) = tokio::join!(long, short);
    long.unwrap();
    short.unwrap();
    // 50 + 10 + 10 spent, about 2 refilled: 32 left, not 72.
    let left = broker.try_acquire("api", Cost::tokens(50)).await.unwrap();
    assert!(!left.allowed, "the unused estimate went back");
    let some = broker.try_acquire("api", Cost::tokens(25)).await.unwrap();
    assert!(some.allowed);
}

/// A store over the in-memory one that answers as one across a network,
/// with no states in process: `try_acquire` only asynchronously (pending
/// on its first poll) when `asynchronous`, a settlement or a penalty
/// `correction` late, the reply to a `try_acquire` `reply` after the store
/// decided it, and to a `take_slot` `slot_reply` after the slot was taken.
struct Remote {
    asynchronous: bool,
    correction: Duration,
    reply: Duration,
    slot_reply: Duration,
}

impl Remote {
    /// Settlements and penalties 50 ms late (so refunds are made by
    /// tasks), and the reply to a `take_slot` 50 ms after the slot.
    const LATE: Remote = Remote {
        asynchronous: true,
        correction: Duration::from_millis(50),
        reply: Duration::ZERO,
        slot_reply: Duration::from_millis(50),
    };
}

impl broker_testkit::Hooks for Remote {
    fn asynchronous(&self) -> bool {
        self.asynchronous
    }
    fn local_states(
        &self,
        _: Arc<dyn broker_core::LocalStates>,
    ) -> Option<Arc<dyn broker_core::LocalStates>> {
        None
    }
    fn correction_delay(&self) -> Duration {
        self.correction
    }
    fn try_acquire_reply_delay(&self, _: &str) -> Duration {
        self.reply
    }
    fn take_slot_reply_delay(&self, _: &str) -> Duration {
        self.slot_reply
    }
}

/// Polls `fut` up to `polls` times, virtual time advancing `step` after
/// each poll, then drops it: whether it completed.
async fn poll_then_drop<F: std::future::Future>(fut: F, polls: usize, step: Duration) -> bool {
    let mut fut = std::pin::pin!(fut);
    for _ in 0..polls {
        let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx)));
        if polled.await.is_ready() {
            return true;
        }
        tokio::time::advance(step).await;
    }
    false
}

/// Every call dropped at every point it can be: after `polls` polls, for
/// 0, 1, 2, ... until the call completes, on the in-memory store and on
/// one that answers as a remote store. Once the drop has settled, nothing
/// is left taken: no count of queued or running work, no slot, and no
/// cost but that of the attempts that went out (a limit of two calls a
/// minute, so refills do not hide a lost token).
#[tokio::test(start_paused = true)]
async fn a_call_dropped_at_any_point_leaks_nothing() {
    let calls = [
        "try_acquire",
        "acquire",
        "enqueue",
        "enqueue_waiting_for_the_slot",
    ];
    for remote in [false, true] {
        for call in calls {
            let mut polls = 0;
            loop {
                let memory = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
                let broker = match remote {
                    false => ResourceBroker::from_arc(memory),
                    true => ResourceBroker::new(broker_testkit::Wrapped::new(memory, Remote::LATE)),
                };
                let limits = Limits::new()
                    .rate(RateLimit::per_minute(2))
                    .max_concurrent(1);
                let config = ResourceConfig::new(limits);
                broker.register("api", config).unwrap();
                // Held 500 ms by another caller, for the call that waits.
                let holder = match call {
                    "enqueue_waiting_for_the_slot" => {
                        let a = broker.acquire("api", Cost::requests(0), Duration::ZERO);
                        let permit = a.await.unwrap().permit;
                        assert!(permit.is_held());
                        Some(tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            drop(permit);
                        }))
                    }
                    _ => None,
                };
                let attempts = Arc::new(Mutex::new(0u64));
                let counted = attempts.clone();
                // The first attempt fails after 1 s of work, the second succeeds.
                let work = move |a: broker_core::Attempt| {
                    *counted.lock().unwrap() += 1;
                    async move {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        match a.number {
                            1 => Outcome::<(), ()>::failed(OutcomeClass::Transient, (), None),
                            _ => Outcome::ok(()),
                        }
                    }
                };
                let step = Duration::from_millis(100);
                let (done, kept) = match call {
                    "try_acquire" => {
                        let a = broker.try_acquire("api", Cost::default());
                        (poll_then_drop(a, polls, step).await, None)
                    }
                    "acquire" => {
                        let kept = Arc::new(Mutex::new(None));
                        let into = kept.clone();
                        let a = async {
                            let a = broker.acquire("api", Cost::default(), Duration::from_secs(5));
                            *into.lock().unwrap() = Some(a.await.unwrap().allowed);
                        };
                        let done = poll_then_drop(a, polls, step).await;
                        let allowed = kept.lock().unwrap().take();
                        (done, allowed)
                    }
                    _ => {
                        let e = broker.enqueue("api", Cost::default(), work);
                        (poll_then_drop(e, polls, step).await, None)
                    }
                };
                // Refunds and releases made by tasks land.
                tokio::time::sleep(Duration::from_millis(600)).await;
                if let Some(holder) = holder {
                    holder.await.unwrap();
                }
                let where_ = format!("{call}, remote {remote}, dropped after {polls} polls");
                let stats = &broker.stats().resources["api"];
                assert_eq!((stats.queued, stats.in_flight), (0, 0), "{where_}");
                let went_out = *attempts.lock().unwrap()
                    + u64::from(kept == Some(true))
                    + u64::from(done && call == "try_acquire");
                let slot = broker.try_acquire("api", Cost::requests(0)).await.unwrap();
                assert!(slot.allowed, "{where_}: a slot was kept");
                drop(slot);
                let left = passing(&broker).await as u64;
                assert_eq!(left, 2 - went_out.min(2), "{where_}: a cost was kept");
                if done {
                    break;
                }
                polls += 1;
                assert!(polls < 200, "{where_}: never completed");
            }
        }
    }
}

/// An `acquire` or an `enqueue` dropped while the reply to its `take_slot`
/// is on the way (a client timeout while the store is slow): the store has
/// granted the lease, and it is released for the caller that went away.
/// Before, nobody released it, and the slot stayed taken until the lease
/// expired (never, on a store whose leases end with their holders).
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_its_slot_is_on_the_way_leaves_the_slot_free() {
    for call in ["acquire", "enqueue"] {
        let memory = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
        let broker = ResourceBroker::new(broker_testkit::Wrapped::new(
            memory,
            Remote {
                asynchronous: false,
                correction: Duration::ZERO,
                reply: Duration::ZERO,
                slot_reply: Duration::from_millis(100),
            },
        ));
        let limits = Limits::new().max_concurrent(1);
        broker.register_limit("api", limits).unwrap();
        // The slot taken at once, its reply 100 ms away: the caller leaves
        // at 50 ms.
        let within = Duration::from_millis(50);
        let left = match call {
            "acquire" => {
                let a = broker.acquire("api", Cost::default(), Duration::from_secs(5));
                tokio::time::timeout(within, a).await.is_err()
            }
            _ => {
                let e = broker.enqueue("api", Cost::default(), |_| async {
                    Outcome::<(), ()>::ok(())
                });
                tokio::time::timeout(within, e).await.is_err()
            }
        };
        assert!(left, "{call}: answered before its caller left");
        // The reply lands, and the lease it grants is given back.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stats = &broker.stats().resources["api"];
        assert_eq!((stats.queued, stats.in_flight), (0, 0), "{call}");
        let next = broker.try_acquire("api", Cost::default()).await.unwrap();
        assert!(next.allowed, "{call}: the slot stayed taken: {next:?}");
    }
}

/// A `try_acquire` dropped while its reply is on the way, the resource
/// registered meanwhile with other buckets (a tokens limit added), which
/// starts its state afresh: the unclaimed decision gives nothing back, as
/// a booking cancelled then does not. Before, it was refunded under the
/// limits it was asked under, and the store started the state afresh
/// again for them: the five calls the new limits had let out in the
/// minute were forgotten, and five more went out.
#[tokio::test(start_paused = true)]
async fn an_unclaimed_decision_is_not_refunded_under_limits_registered_over() {
    let memory = Arc::new(MemoryBackend::with_clock(TokioClock::new()));
    let broker = ResourceBroker::new(broker_testkit::Wrapped::new(
        memory,
        Remote {
            asynchronous: true,
            correction: Duration::ZERO,
            reply: Duration::from_millis(100),
            slot_reply: Duration::ZERO,
        },
    ));
    broker
        .register_limit("api", Limits::new().rate(RateLimit::per_minute(5)))
        .unwrap();
    // Decided at once, its reply 100 ms away: the caller leaves at 50 ms.
    let left = tokio::time::timeout(
        Duration::from_millis(50),
        broker.try_acquire("api", Cost::default()),
    );
    assert!(left.await.is_err(), "answered before its caller left");
    let limits = Limits::new()
        .rate(RateLimit::per_minute(5))
        .rate(RateLimit::per_minute(1_000).unit(Unit::Tokens));
    broker.register_limit("api", limits).unwrap();
    // The whole minute's five, decided before the unclaimed reply lands.
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let broker = broker.clone();
            tokio::spawn(async move { broker.try_acquire("api", Cost::default()).await })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap().unwrap().allowed);
    }
    let more = broker_testkit::allowed_in_a_row(&broker, "api").await;
    assert_eq!(more, 0, "{more} calls went out beyond the five a minute");
}

/// A resource registered with `register_limit` (limit-only) is queued
/// too, as `register_limit` says: with the default queue capacity and
/// retry policy of `ResourceConfig::new`, and still marked limit-only in
/// the stats.
#[tokio::test(start_paused = true)]
async fn enqueue_on_a_limit_only_resource_uses_the_default_queue() {
    let broker = broker();
    broker.register_limit("hook", seed_limits()).unwrap();
    let refused = |attempt: broker_core::Attempt| async move {
        match attempt.number {
            1 => Outcome::<u32, ()>::rate_limited((), Some(Duration::from_millis(100))),
            n => Outcome::ok(n),
        }
    };
    let attempts = broker.enqueue("hook", Cost::default(), refused).await;
    assert_eq!(attempts.unwrap(), 2, "retried by the default policy");
    let stats = &broker.stats().resources["hook"];
    assert_eq!(stats.kind, broker_core::ResourceKind::LimitOnly);
    assert_eq!((stats.completed, stats.retries, stats.queued), (1, 1, 0));
}

/// What happens to a call after its resource is registered again (a
/// config reload while it runs) is in the stats the broker reports, as it
/// is in the metrics (by resource id): its 429, its retry, its second
/// admission and its completion. Before, they went to the replaced
/// registration's counters, which `stats()` no longer reports: the call
/// left the queue and never showed as completed.
#[tokio::test(start_paused = true)]
async fn a_call_running_across_a_re_registration_is_counted_in_the_new_stats() {
    let broker = broker();
    broker
        .register("api", ResourceConfig::new(seed_limits()))
        .unwrap();
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let wait = Arc::new(Mutex::new(Some(wait)));
    let b = broker.clone();
    let call = tokio::spawn(async move {
        b.enqueue("api", Cost::default(), |attempt| {
            let wait = wait.lock().unwrap().take();
            async move {
                if attempt.number > 1 {
                    return Outcome::<(), ()>::ok(());
                }
                wait.unwrap().await.unwrap();
                Outcome::rate_limited((), Some(Duration::from_millis(100)))
            }
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(broker.stats().resources["api"].in_flight, 1);
    broker
        .register("api", ResourceConfig::new(seed_limits()))
        .unwrap();
    go.send(()).unwrap();
    call.await.unwrap().unwrap();
    let stats = broker.stats().resources["api"].clone();
    assert_eq!(
        (stats.upstream_429, stats.retries, stats.allowed),
        (1, 1, 1),
        "{stats:?}"
    );
    assert_eq!(
        (stats.completed, stats.queued, stats.in_flight),
        (1, 0, 0),
        "{stats:?}"
    );
}

/// A call booked while this process already penalizes the state (for a spent
/// counter the call's cost does not draw on, which the store holds only
/// in that counter's bucket) is charged once: the booking it made under
/// the penalty is given back when it waits the penalty out, as a cancelled
/// one's is, and the cost is booked again when the penalty ends. Before,
/// the first booking stayed spent too: one call took two requests.
#[tokio::test(start_paused = true)]
async fn a_call_booked_under_a_penalty_is_charged_once() {
    let broker = broker();
    // Six requests an hour (one per 10 min: next to no refill in 30 s).
    let limits = Limits::new()
        .rate(RateLimit::per(6, Duration::from_secs(3600)))
        .rate(RateLimit::per(1000, Duration::from_secs(3600)).unit(Unit::Tokens));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let spent_tokens = broker_core::ObservedLimit {
        tokens: Some(broker_core::Observed {
            limit: None,
            remaining: Some(0),
            reset: Some(Duration::from_secs(30)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let first = broker
        .enqueue("api", Cost::tokens(100), |_| {
            let spent_tokens = spent_tokens.clone();
            async move { Outcome::<(), ()>::ok(()).with_observed(spent_tokens) }
        })
        .await;
    first.unwrap();
    // A call of requests only, during the 30 s penalty: it waits it out.
    let start = Instant::now();
    let ok = |_| async { Outcome::<(), ()>::ok(()) };
    broker.enqueue("api", Cost::requests(1), ok).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    // Two calls made, two requests spent: four left (not three).
    assert_eq!(passing(&broker).await, 4);
}

/// An `acquire` denied because this process penalizes the state beyond its
/// `max_wait` (an upstream 429 the store failed to take as a penalty)
/// books nothing, as a denial says: before, the booking it made under the
/// penalty stayed spent, so every denied call took a request.
#[tokio::test(start_paused = true)]
async fn an_acquire_denied_by_a_penalty_takes_nothing() {
    let broker = broker_missing_penalties();
    // Six requests an hour: a 429's penalty is one token's refill, 10 min.
    let limits = Limits::new().rate(RateLimit::per(6, Duration::from_secs(3600)));
    let once = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    broker
        .register(
            "api",
            ResourceConfig {
                retry: once,
                ..ResourceConfig::new(limits)
            },
        )
        .unwrap();
    let refused = broker
        .enqueue("api", Cost::default(), |_| async {
            Outcome::<(), &str>::rate_limited("429", None)
        })
        .await;
    assert!(matches!(
        refused,
        Err(EnqueueError::RetriesExhausted { attempts: 1, .. })
    ));
    for _ in 0..3 {
        let a = broker
            .acquire("api", Cost::default(), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(!a.allowed, "held for 10 min");
    }
    // One request spent (the refused call's): five left, not two.
    assert_eq!(passing(&broker).await, 5);
}

/// A transient failure that says when the upstream expects to be back (a
/// 503 with `Retry-After: 30`) is retried no sooner: before, the jittered
/// step of a few hundred milliseconds spent the attempts within about a
/// second of an upstream that had said it would be down for 30.
#[tokio::test(start_paused = true)]
async fn a_503_with_retry_after_is_retried_no_sooner() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_second(10));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let attempts: Started = Arc::default();
    let start = Instant::now();
    let seen = broker_core::ObservedLimit {
        retry_after: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let done = broker
        .enqueue("api", Cost::default(), |a| {
            let (attempts, seen) = (attempts.clone(), seen.clone());
            async move {
                let at = start.elapsed();
                attempts.lock().unwrap().push((a.number.to_string(), at));
                if a.number == 1 {
                    Outcome::failed(OutcomeClass::from_status(503), "unavailable", Some(seen))
                } else {
                    Outcome::<&str, &str>::ok("done")
                }
            }
        })
        .await;
    assert_eq!(done.unwrap(), "done");
    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert!(
        attempts[1].1 - attempts[0].1 >= Duration::from_secs(30),
        "{attempts:?}"
    );
}
