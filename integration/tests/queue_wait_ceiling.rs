//! Issue 42: waiting for one's turn in the queue is not waiting out a
//! penalty. A call waits for its turn as long as the queue holds it,
//! unless it has a deadline; the retry policy's ceiling bounds penalties
//! only; every wait error says how long the call waited, how long it
//! would still wait and which bound it met. Memory store, tokio's paused
//! time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    BrokerError, Cost, EnqueueError, Limits, Outcome, RateLimit, ResourceBroker, ResourceConfig,
    RetryPolicy, Target, TokioClock, WaitBound,
};
use broker_memory::MemoryBackend;
use tokio::time::Instant;

fn broker() -> ResourceBroker {
    ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()))
}

/// A retry policy whose ceiling is 3 s on a resource of 1/s.
fn three_second_ceiling() -> RetryPolicy {
    RetryPolicy {
        wait_ceiling: Duration::from_secs(3),
        ..RetryPolicy::default()
    }
}

/// The repro of issue 42: 1/s, ceiling 3 s, 4 calls at once; the first is
/// answered 429 with Retry-After 2 s after 1.5 s. Every call completes
/// (before, calls 1 and 2 failed at 2 s and 3 s with `WaitTooLong`).
#[tokio::test(start_paused = true)]
async fn a_penalty_within_the_ceiling_fails_no_call_queued_behind_it() {
    let broker = broker();
    let config = ResourceConfig {
        retry: three_second_ceiling(),
        ..ResourceConfig::new(Limits::new().rate(RateLimit::per_second(1)))
    };
    broker.register("api", config).unwrap();
    let first_attempts = Arc::new(AtomicU32::new(0));
    let mut calls = Vec::new();
    for i in 0..4 {
        let (broker, first_attempts) = (broker.clone(), first_attempts.clone());
        calls.push(tokio::spawn(async move {
            broker
                .enqueue("api", Cost::default(), move |attempt| {
                    let first_attempts = first_attempts.clone();
                    async move {
                        if i == 0 && attempt.number == 1 {
                            first_attempts.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            return Outcome::rate_limited("429", Some(Duration::from_secs(2)));
                        }
                        Outcome::<(), &str>::ok(())
                    }
                })
                .await
        }));
        tokio::task::yield_now().await;
    }
    for (i, call) in calls.into_iter().enumerate() {
        let result = call.await.unwrap();
        assert!(result.is_ok(), "call {i}: {result:?}");
    }
    assert_eq!(first_attempts.load(Ordering::Relaxed), 1);
    let stats = &broker.stats().resources["api"];
    assert_eq!(
        (stats.completed, stats.failed, stats.upstream_429),
        (4, 0, 1)
    );
}

/// An LLM batch of 10,000 calls enqueued at once under 500 RPM completes
/// with every call done and no error, in virtual time.
#[tokio::test(start_paused = true)]
async fn a_batch_of_ten_thousand_at_once_under_500_rpm_completes() {
    const CALLS: usize = 10_000;
    let broker = broker();
    let config = ResourceConfig {
        queue_capacity: CALLS,
        ..ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(500)))
    };
    broker.register("llm", config).unwrap();
    let t0 = Instant::now();
    let mut calls = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let broker = broker.clone();
        calls.push(tokio::spawn(async move {
            broker
                .enqueue("llm", Cost::default(), |_| async {
                    Outcome::<(), ()>::ok(())
                })
                .await
        }));
    }
    let mut errors = 0;
    for call in calls {
        if call.await.unwrap().is_err() {
            errors += 1;
        }
    }
    assert_eq!(errors, 0);
    let stats = &broker.stats().resources["llm"];
    assert_eq!((stats.completed, stats.failed), (CALLS as u64, 0));
    // 500 a minute: the last of 10,000 goes out after about 20 minutes.
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(19 * 60) && took <= Duration::from_secs(21 * 60),
        "{took:?}"
    );
}

fn ok(_: broker_core::Attempt) -> std::future::Ready<Outcome<(), std::io::Error>> {
    std::future::ready(Outcome::ok(()))
}

/// A call with a deadline that its turn would come after ends at once in
/// `WaitTooLong`, telling how long it waited, how long it would still
/// wait, and the deadline it met.
#[tokio::test(start_paused = true)]
async fn a_deadline_ends_the_wait_with_the_truthful_fields() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_second(1));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    // Three calls take the sends at 0 s, 1 s and 2 s.
    let mut early = Vec::new();
    for _ in 0..3 {
        let broker = broker.clone();
        early.push(tokio::spawn(async move {
            broker.enqueue("api", Cost::default(), ok).await
        }));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deadline = Duration::from_millis(1200);
    let target = Target::from("api").deadline(deadline);
    let err = broker
        .enqueue(target, Cost::default(), ok)
        .await
        .unwrap_err();
    let EnqueueError::Broker(BrokerError::WaitTooLong {
        waited,
        would_wait,
        bound,
        ..
    }) = &err
    else {
        panic!("{err:?}");
    };
    // Its send time would be 3 s: 2.5 s from when it asked, at once.
    assert_eq!(
        (*waited, *would_wait, *bound),
        (
            Duration::ZERO,
            Duration::from_millis(2500),
            WaitBound::Deadline(deadline)
        )
    );
    assert_eq!(
        err.to_string(),
        "resource \"api\": waited 0ns; the next send time is 2.5s away, beyond the deadline 1.2s"
    );
    for call in early {
        call.await.unwrap().unwrap();
    }
}

/// A call queued behind another when its deadline comes ends then, and
/// says how long it waited; the resource's `queue_deadline` is the
/// default of a call that sets none.
#[tokio::test(start_paused = true)]
async fn a_queued_call_ends_at_the_resource_queue_deadline() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_minute(1));
    let config = ResourceConfig {
        queue_deadline: Some(Duration::from_secs(5)),
        ..ResourceConfig::new(limits)
    };
    broker.register("slow", config).unwrap();
    // Four calls with a deadline of their own: the first goes at once,
    // the next two book the next two minutes, the fourth is head and
    // waits for its time to come within its horizon.
    let mut first = Vec::new();
    for _ in 0..4 {
        let broker = broker.clone();
        first.push(tokio::spawn(async move {
            let target = Target::from("slow").deadline(Duration::from_secs(3600));
            broker.enqueue(target, Cost::default(), ok).await
        }));
        tokio::task::yield_now().await;
    }
    let t0 = Instant::now();
    let err = broker
        .enqueue("slow", Cost::default(), ok)
        .await
        .unwrap_err();
    let EnqueueError::Broker(BrokerError::WaitTooLong {
        waited,
        would_wait,
        bound,
        ..
    }) = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*bound, WaitBound::Deadline(Duration::from_secs(5)));
    assert_eq!(
        (*waited, t0.elapsed()),
        (Duration::from_secs(5), Duration::from_secs(5))
    );
    // The head goes at 180 s, this call a minute later: 235 s from its
    // deadline.
    assert_eq!(*would_wait, Duration::from_secs(235), "{err}");
    for call in first {
        call.await.unwrap().unwrap();
    }
}

/// A penalty beyond the retry policy's ceiling (a penalty of an hour) ends
/// the call with the penalty bound, quoting the penalty still ahead.
#[tokio::test(start_paused = true)]
async fn a_penalty_beyond_the_ceiling_names_the_penalty_bound() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_second(1));
    let config = ResourceConfig {
        retry: three_second_ceiling(),
        ..ResourceConfig::new(limits)
    };
    broker.register("api", config).unwrap();
    broker
        .penalize("api", Duration::from_secs(3600))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(600)).await;
    let err = broker
        .enqueue("api", Cost::default(), ok)
        .await
        .unwrap_err();
    let EnqueueError::Broker(BrokerError::WaitTooLong {
        waited,
        would_wait,
        bound,
        ..
    }) = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*bound, WaitBound::PenaltyCeiling(Duration::from_secs(3)));
    assert_eq!(*waited, Duration::ZERO);
    assert_eq!(*would_wait, Duration::from_secs(3000));
    assert!(
        err.to_string().contains("beyond the penalty ceiling 3s"),
        "{err}"
    );
}

/// `QueueFull` tells the depth and the capacity.
#[tokio::test(start_paused = true)]
async fn queue_full_tells_depth_and_capacity() {
    let broker = broker();
    let limits = Limits::new().rate(RateLimit::per_minute(1));
    broker
        .register(
            "slow",
            ResourceConfig {
                queue_capacity: 2,
                ..ResourceConfig::new(limits)
            },
        )
        .unwrap();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let broker = broker.clone();
        waiting.push(tokio::spawn(async move {
            broker.enqueue("slow", Cost::default(), ok).await
        }));
        tokio::task::yield_now().await;
    }
    let err = broker
        .enqueue("slow", Cost::default(), ok)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "queue of resource \"slow\" is full (2 waiting, capacity 2)"
    );
    for w in waiting {
        w.await.unwrap().unwrap();
    }
}
