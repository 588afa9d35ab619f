//! How the upstream's answers feed back into the bucket: a failed
//! reconcile or settle never fails a successful response; reconcile skips
//! the backend when nothing would narrow; a pacing margin absorbs the drift
//! between our send time and the upstream's receive time; transient
//! failures retry after a short jittered pause.

mod upstream_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    BackendError, Cost, EnqueueError, Limits, Marks, Observed, ObservedLimit, Outcome,
    OutcomeClass, RateLimit, ResourceBroker, ResourceConfig, TokioClock,
};
use broker_memory::MemoryBackend;
use broker_testkit::upstream::no_time_passes;
use broker_testkit::{Hooks, Quota, Upstream, UpstreamConfig, Wrapped};
use tokio::time::Instant;
use upstream_support::{call_now, http_client, Headers};

/// The in-memory store, with `reconcile` and `settle` failing on demand and
/// `reconcile` calls counted.
struct Flaky {
    fail: bool,
    reconciles: Arc<AtomicU64>,
}

impl Hooks for Flaky {
    fn settle(&self, _: &str, _: Option<Marks>) -> Option<Result<(), BackendError>> {
        self.fail.then(|| Err(BackendError::new("settle failed")))
    }
    fn reconcile(&self) -> Option<Result<(), BackendError>> {
        self.reconciles.fetch_add(1, Ordering::SeqCst);
        self.fail
            .then(|| Err(BackendError::new("reconcile failed")))
    }
}

fn flaky(fail: bool) -> (ResourceBroker, Arc<AtomicU64>) {
    let reconciles = Arc::new(AtomicU64::new(0));
    let backend = Wrapped::new(
        Arc::new(MemoryBackend::with_clock(TokioClock::new())),
        Flaky {
            fail,
            reconciles: reconciles.clone(),
        },
    );
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new()
        .rate(RateLimit::per_minute(60))
        .rate(RateLimit::per(10_000, Duration::from_secs(60)).unit(broker_core::Unit::Tokens));
    broker.register("llm", ResourceConfig::new(limits)).unwrap();
    (broker, reconciles)
}

fn observed(remaining: u64) -> ObservedLimit {
    ObservedLimit {
        requests: Some(Observed {
            limit: Some(60),
            remaining: Some(remaining),
            reset: Some(Duration::from_secs(30)),
            ..Default::default()
        }),
        ..ObservedLimit::default()
    }
}

#[tokio::test(start_paused = true)]
async fn failed_reconcile_or_settle_never_fails_a_successful_response() {
    let (broker, reconciles) = flaky(true);
    let r: Result<&str, EnqueueError<&str>> = broker
        .enqueue("llm", Cost::tokens(500), |_| async {
            Outcome::ok_with_usage("answer", Cost::tokens(120)).with_observed(observed(3))
        })
        .await;
    assert_eq!(r.unwrap(), "answer");
    assert_eq!(reconciles.load(Ordering::SeqCst), 1);
    let stats = &broker.stats().resources["llm"];
    assert_eq!((stats.completed, stats.backend_errors), (1, 2), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn reconcile_skips_the_backend_when_nothing_narrows() {
    let (broker, reconciles) = flaky(false);
    // Remaining at or above the capacity (60): nothing to narrow.
    broker.reconcile("llm", &observed(60)).await.unwrap();
    broker.reconcile("llm", &observed(300)).await.unwrap();
    broker
        .reconcile("llm", &ObservedLimit::default())
        .await
        .unwrap();
    assert_eq!(reconciles.load(Ordering::SeqCst), 0);
    // Below it: one call, and the bucket holds 5.
    broker.reconcile("llm", &observed(5)).await.unwrap();
    assert_eq!(reconciles.load(Ordering::SeqCst), 1);
    for _ in 0..5 {
        assert!(
            broker
                .try_acquire("llm", Cost::default())
                .await
                .unwrap()
                .allowed
        );
    }
    assert!(
        !broker
            .try_acquire("llm", Cost::default())
            .await
            .unwrap()
            .allowed
    );
}

#[tokio::test(start_paused = true)]
async fn transient_errors_retry_after_a_short_jittered_pause() {
    let (broker, _) = flaky(false);
    let start = Instant::now();
    let mut failures = 2;
    let r: Result<u32, EnqueueError<&str>> = broker
        .enqueue("llm", Cost::default(), |a| {
            let fail = failures > 0;
            failures -= 1;
            async move {
                if fail {
                    Outcome::failed(OutcomeClass::Transient, "503", None)
                } else {
                    Outcome::ok(a.number)
                }
            }
        })
        .await;
    assert_eq!(r.unwrap(), 3);
    // Full jitter under 100 ms and 200 ms, plus at most the 1 s refill of
    // the third request token (60/min, burst 60: none needed here).
    assert!(
        start.elapsed() <= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
}

/// 100 jobs one after another through a bucket of 1 per second, burst 1,
/// against the same strict upstream quota (as the seed's `sales`: one
/// request per window, no burst); each request is on the wire for 0..=40 ms
/// (a fixed pseudo-random spread). We space sends exactly one second
/// apart, so whenever a request travels faster than the one before, the
/// upstream receives the two less than a second apart.
async fn drift_run(margin: f64) -> (u32, u32) {
    let quota = Quota::per(1, Duration::from_secs(1));
    let upstream = Upstream::start(UpstreamConfig::new(quota)).await.unwrap();
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    let limits = Limits::new().rate(RateLimit::per_second(1));
    let config = ResourceConfig {
        pacing_margin: margin,
        ..ResourceConfig::new(limits)
    };
    broker.register("api", config).unwrap();
    let http = http_client();
    let url = upstream.url();
    for i in 0..100u64 {
        let latency = Duration::from_millis((i * 7_919) % 41);
        let (http, url) = (&http, &url);
        let _: Result<u64, EnqueueError<String>> = broker
            .enqueue("api", Cost::default(), |_| async move {
                tokio::time::sleep(latency).await;
                no_time_passes(call_now(http, url, 0, Headers::Ignore)).await
            })
            .await;
    }
    let t = upstream.tally("ours");
    (t.ok, t.rejected)
}

#[tokio::test(start_paused = true)]
async fn pacing_margin_absorbs_send_versus_receive_drift() {
    let exact = drift_run(0.0).await;
    let paced = drift_run(0.05).await;
    println!(
        "latency 0..=40 ms, 1/s burst 1: no margin {} × 200, {} × 429; 5% margin {} × 200, {} × 429",
        exact.0, exact.1, paced.0, paced.1
    );
    assert!(exact.1 > 0, "the drift must cause 429s without a margin");
    assert_eq!(
        paced.1, 0,
        "a 5% margin (53 ms a token) covers 40 ms of drift"
    );
}

#[tokio::test(start_paused = true)]
async fn headers_of_a_failed_response_are_reconciled_too() {
    let (broker, reconciles) = flaky(false);
    // A 503 that says 2 requests remain, then a fatal 403 that says 0
    // remain: both readings reach the bucket.
    let mut attempts = 0;
    let r: Result<u32, EnqueueError<&str>> = broker
        .enqueue("llm", Cost::default(), |a| {
            attempts += 1;
            let outcome = if a.number == 1 {
                Outcome::failed(OutcomeClass::Transient, "503", None).with_observed(observed(2))
            } else {
                Outcome::failed(OutcomeClass::Fatal, "403", Some(observed(0)))
            };
            async move { outcome }
        })
        .await;
    assert!(
        matches!(r, Err(EnqueueError::Fatal { attempts: 2, .. })),
        "{r:?}"
    );
    assert_eq!(attempts, 2);
    assert_eq!(reconciles.load(Ordering::SeqCst), 2);
    // `remaining 0` holds the bucket until the reset (30 s): nothing fits now.
    let a = broker.try_acquire("llm", Cost::default()).await.unwrap();
    assert!(!a.allowed);
    assert!(a.wait_time > Duration::from_secs(25), "{:?}", a.wait_time);
}

/// A store across a network: its corrections (settle, penalize) take
/// `delay` to arrive.
struct Distant {
    delay: Duration,
}

impl Hooks for Distant {
    fn correction_delay(&self) -> Duration {
        self.delay
    }
}

/// A success whose headers say the upstream's counter is spent (remaining
/// 0, reset in 10 s), on a store whose settlement is a round trip: the
/// call waiting for the only slot must wait the reset out, not take the
/// slot the first call frees and go out while that call is still settling
/// (before, it went out at once, into the spent window: the exhausted
/// counter's penalty was put on only after the settlement, the slot freed
/// before both).
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_the_slot_waits_out_a_counter_a_success_reported_spent() {
    let backend = Wrapped::new(
        Arc::new(MemoryBackend::with_clock(TokioClock::new())),
        Distant {
            delay: Duration::from_millis(50),
        },
    );
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new()
        .rate(RateLimit::per_second(100))
        .rate(RateLimit::per(10_000, Duration::from_secs(60)).unit(broker_core::Unit::Tokens))
        .max_concurrent(1);
    broker.register("llm", ResourceConfig::new(limits)).unwrap();
    let spent = ObservedLimit {
        requests: Some(Observed {
            limit: Some(100),
            remaining: Some(0),
            reset: Some(Duration::from_secs(10)),
            ..Default::default()
        }),
        ..ObservedLimit::default()
    };
    let answered = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let first = {
        let (broker, answered) = (broker.clone(), answered.clone());
        tokio::spawn(async move {
            broker
                .enqueue("llm", Cost::tokens(500), |_| {
                    let (answered, spent) = (answered.clone(), spent.clone());
                    async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        *answered.lock().unwrap() = Some(Instant::now());
                        Outcome::<(), &str>::ok_with_usage((), Cost::tokens(100))
                            .with_observed(spent)
                    }
                })
                .await
        })
    };
    // The first call holds the slot; the second waits for it.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second: Result<Instant, EnqueueError<&str>> = broker
        .enqueue("llm", Cost::tokens(500), |_| async {
            Outcome::ok(Instant::now())
        })
        .await;
    first.await.unwrap().unwrap();
    let went = second.unwrap();
    let answered = answered.lock().unwrap().unwrap();
    assert!(
        went >= answered + Duration::from_secs(10),
        "the waiting call went out {:?} after the upstream said its counter was spent for 10 s",
        went - answered
    );
}
