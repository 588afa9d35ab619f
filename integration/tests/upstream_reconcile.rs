//! Learning from the upstream's headers: with `reconcile` our bucket
//! follows the upstream's real counter (spent also by a foreign client),
//! and the 429s fall at least fivefold against penalize-only in the same
//! run; a registry set below the real limit stays as configured and the
//! divergence is logged.
//!
//! Run with `--nocapture` to see the measured figures.

mod upstream_support;

use std::time::Duration;

use broker_core::{Cost, EnqueueError, Limits, RateLimit, ResourceConfig};
use broker_testkit::capture_logs;
use broker_testkit::{Quota, Upstream, UpstreamConfig};
use upstream_support::{call, http_client, memory_broker, Headers};

struct Run {
    jobs: u64,
    completed: u64,
    failed: u64,
    ok: u32,
    rejected: u32,
    foreign_ok: u32,
    elapsed: Duration,
}

impl Run {
    fn per_thousand(&self) -> f64 {
        self.rejected as f64 * 1000.0 / f64::from(self.ok + self.rejected)
    }
}

/// `jobs` jobs by `workers` workers against an upstream of 120/min, our
/// registry at the same 120/min, a foreign client spending 30% of it.
async fn run(mode: Headers, jobs: u64, workers: u64) -> Run {
    let quota = Quota::per(120, Duration::from_secs(60));
    let upstream = Upstream::start(UpstreamConfig::new(quota)).await.unwrap();
    // 30% of 120/min: 36/min, one every 1⅔ s, for longer than the run.
    let foreign = upstream.spawn_foreign(Duration::from_micros(1_666_667), 100_000);
    let broker = memory_broker();
    broker
        .register(
            "api",
            ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(120))),
        )
        .unwrap();
    let url = format!("{}/v1/data", upstream.url());
    let http = http_client();
    let per_worker = jobs / workers;
    let tasks = (0..workers).map(|_| {
        let broker = broker.clone();
        let http = http.clone();
        let url = url.clone();
        async move {
            let mut done = (0u64, 0u64);
            for _ in 0..per_worker {
                let r: Result<u64, EnqueueError<String>> = broker
                    .enqueue("api", Cost::default(), |_| call(&http, &url, 0, mode))
                    .await;
                match r {
                    Ok(_) => done.0 += 1,
                    Err(_) => done.1 += 1,
                }
            }
            done
        }
    });
    let results = futures::future::join_all(tasks).await;
    foreign.abort();
    let ours = upstream.tally("ours");
    Run {
        jobs: per_worker * workers,
        completed: results.iter().map(|r| r.0).sum(),
        failed: results.iter().map(|r| r.1).sum(),
        ok: ours.ok,
        rejected: ours.rejected,
        foreign_ok: upstream.tally("foreign").ok,
        elapsed: upstream.elapsed(),
    }
}

fn report(name: &str, r: &Run) {
    println!(
        "{name:>16}: {} jobs, {} completed, {} failed; upstream saw {} requests from us: {} ok, {} × 429 \
         ({:.1} per 1,000); foreign ok {}; {:.1} virtual min",
        r.jobs,
        r.completed,
        r.failed,
        r.ok + r.rejected,
        r.ok,
        r.rejected,
        r.per_thousand(),
        r.foreign_ok,
        r.elapsed.as_secs_f64() / 60.0
    );
}

#[tokio::test(start_paused = true)]
async fn reconcile_cuts_upstream_429s_at_least_fivefold_against_penalize_only() {
    let (off, on) = tokio::join!(
        run(Headers::Ignore, 1000, 4),
        run(Headers::Reconcile, 1000, 4)
    );
    report("penalize only", &off);
    report("with reconcile", &on);
    for r in [&off, &on] {
        assert_eq!(r.completed + r.failed, r.jobs, "every job returns");
    }
    assert!(off.rejected > 0, "the foreign client must cause 429s");
    assert!(
        off.per_thousand() >= 5.0 * on.per_thousand(),
        "429s per 1,000: {:.1} without reconcile, {:.1} with",
        off.per_thousand(),
        on.per_thousand()
    );
}

#[tokio::test(start_paused = true)]
async fn registry_below_the_real_limit_logs_the_divergence_and_never_widens() {
    let (logs, _guard) = capture_logs(tracing::Level::DEBUG);
    // The upstream allows and announces 300/min; our registry says 60/min.
    let upstream = Upstream::start(UpstreamConfig::new(Quota::per(
        300,
        Duration::from_secs(60),
    )))
    .await
    .unwrap();
    let broker = memory_broker();
    broker
        .register(
            "statistics",
            ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(60))),
        )
        .unwrap();
    let http = http_client();
    let url = format!("{}/statistics", upstream.url());
    let jobs = 300u64;
    for _ in 0..jobs {
        let r: Result<u64, EnqueueError<String>> = broker
            .enqueue("statistics", Cost::default(), |_| {
                call(&http, &url, 0, Headers::Reconcile)
            })
            .await;
        r.unwrap();
    }
    let ours = upstream.tally("ours");
    let elapsed = upstream.elapsed();
    // At our configured 60/min: burst 60 then one per second.
    let allowed_by_registry = 60 + elapsed.as_secs();
    println!(
        "registry 60/min, upstream 300/min: {} requests in {:.1} virtual min ({:.1}/min), {} × 429; \
         at most {} allowed by the registry",
        ours.ok + ours.rejected,
        elapsed.as_secs_f64() / 60.0,
        f64::from(ours.ok) * 60.0 / elapsed.as_secs_f64(),
        ours.rejected,
        allowed_by_registry
    );
    assert_eq!(u64::from(ours.ok), jobs);
    assert_eq!(ours.rejected, 0);
    assert!(
        u64::from(ours.ok) <= allowed_by_registry,
        "the bucket widened: {} requests in {elapsed:?}",
        ours.ok
    );
    // 300 jobs at 60/min: the first 60 at once, then 240 s for the rest.
    assert!(elapsed >= Duration::from_secs(239), "{elapsed:?}");
    assert_eq!(broker.limits("statistics").unwrap().rates[0].amount, 60);
    let text = logs.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("upstream reports a limit other than the configured one"))
        .collect();
    assert_eq!(lines.len(), 1, "logged once per distinct value:\n{text}");
    assert!(lines[0].contains("DEBUG"), "{}", lines[0]);
    assert!(lines[0].contains("observed_limit=300"), "{}", lines[0]);
    assert!(lines[0].contains("configured=60"), "{}", lines[0]);
}

/// An upstream counter describes one window: with 10 a second and 1,000 a
/// day of one unit, a per-second counter at 0 narrows the per-second
/// bucket only, on the in-memory store and on Redis alike, and the daily
/// budget stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_narrows_only_the_window_it_describes() {
    use broker_core::{Observed, ObservedLimit, Store};
    let limits = Limits::new()
        .rate(RateLimit::per_second(10))
        .rate(RateLimit::per(1000, Duration::from_secs(86_400)));
    let spec = broker_core::LimitSpec::new(&limits, Duration::from_secs(60));
    let per_second = |limit| ObservedLimit {
        requests: Some(Observed {
            limit,
            remaining: Some(0),
            reset: Some(Duration::from_secs(1)),
            ..Default::default()
        }),
        ..ObservedLimit::default()
    };
    let server = broker_testkit::RedisServer::start();
    let redis = broker_redis::RedisBackend::connect(&server.url())
        .await
        .unwrap();
    let memory = broker_memory::MemoryBackend::new();
    let stores: [(&str, &dyn Store); 2] = [("memory", &memory), ("redis", &redis)];
    for (name, store) in stores {
        for (i, limit) in [Some(10), None].into_iter().enumerate() {
            let key = format!("k{i}");
            assert!(
                store
                    .try_acquire(&key, &spec, Cost::default())
                    .await
                    .unwrap()
                    .allowed
            );
            store
                .reconcile(&key, &spec, &per_second(limit))
                .await
                .unwrap();
            // Once the second has passed, the day still has its budget.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let mut allowed = 0;
            while store
                .try_acquire(&key, &spec, Cost::default())
                .await
                .unwrap()
                .allowed
            {
                allowed += 1;
            }
            assert!(allowed >= 10, "{name}, limit {limit:?}: {allowed} allowed");
        }
    }
}

/// With several limits of one unit (10 a second and 1,000 a day), an
/// upstream `limit` is calibration material for the one bucket its counter
/// describes (the nearest burst): a limit equal to that bucket's capacity
/// is no divergence, and one that differs is logged against that bucket's
/// capacity, not against the daily one.
#[tokio::test(start_paused = true)]
async fn a_limit_is_compared_with_the_bucket_its_counter_describes() {
    use broker_core::{Observed, ObservedLimit};
    let (logs, _guard) = capture_logs(tracing::Level::DEBUG);
    let broker = memory_broker();
    let limits = Limits::new()
        .rate(RateLimit::per_second(10))
        .rate(RateLimit::per(1000, Duration::from_secs(86_400)));
    broker.register_limit("api", limits).unwrap();
    let seen = |limit| ObservedLimit {
        requests: Some(Observed {
            limit: Some(limit),
            remaining: Some(5),
            reset: Some(Duration::from_secs(1)),
            ..Default::default()
        }),
        ..ObservedLimit::default()
    };
    let divergences = || {
        let text = logs.text();
        text.lines()
            .filter(|l| l.contains("upstream reports a limit other than the configured one"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    broker.reconcile("api", &seen(10)).await.unwrap();
    assert_eq!(
        divergences(),
        Vec::<String>::new(),
        "10 is the per-second burst"
    );
    broker.reconcile("api", &seen(12)).await.unwrap();
    let lines = divergences();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("observed_limit=12"), "{}", lines[0]);
    assert!(lines[0].contains("configured=10"), "{}", lines[0]);
}

/// With 10 a second and 1,000 a day of one unit, a counter whose reset is
/// hours away describes the day, not the second, whatever limit it
/// reports (none, or 500: nearer the second's burst of 10 than the day's
/// 1,000): 20 left in the upstream's day narrow the daily bucket, and at
/// most those 20 (and the day's refill of under one a minute) go out in
/// the next minute, not ten a second (before, the counter was read as the
/// per-second bucket's, where 20 left narrow nothing).
#[tokio::test(start_paused = true)]
async fn a_counter_with_a_reset_of_hours_is_not_read_as_the_per_second_window() {
    use broker_core::{Observed, ObservedLimit};
    for limit in [Some(500), None] {
        let broker = memory_broker();
        let limits = Limits::new()
            .rate(RateLimit::per_second(10))
            .rate(RateLimit::per(1000, Duration::from_secs(86_400)));
        broker.register_limit("api", limits).unwrap();
        let daily = ObservedLimit {
            requests: Some(Observed {
                limit,
                remaining: Some(20),
                reset: Some(Duration::from_secs(5 * 3600)),
                ..Default::default()
            }),
            ..ObservedLimit::default()
        };
        broker.reconcile("api", &daily).await.unwrap();
        let mut allowed = 0;
        for _ in 0..600 {
            allowed += broker_testkit::allowed_in_a_row(&broker, "api").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            allowed <= 21,
            "limit {limit:?}: {allowed} sent in a minute with 20 left in the upstream's day"
        );
    }
}

/// With 150,000 tokens a minute and 10,000,000 a day, a counter that
/// reports the minute's limit of 150,000 describes the minute whatever its
/// reset (OpenAI's per-minute token counter reports resets such as
/// "6m0s"): spent, it holds the per-minute bucket until the reset, and the
/// minute after that refills it, not the day's (before, the reset too long
/// for a minute's window read it as the day's counter: the daily bucket
/// was drained, and a call of 100,000 tokens 7 minutes later was refused,
/// the day's budget refilling at under 120 tokens a second).
#[tokio::test(start_paused = true)]
async fn a_counter_naming_the_minutes_limit_is_the_minutes_whatever_its_reset() {
    use broker_core::{Observed, ObservedLimit, Unit};
    let broker = memory_broker();
    let limits = Limits::new()
        .rate(RateLimit::per_minute(150_000).unit(Unit::Tokens))
        .rate(RateLimit::per(10_000_000, Duration::from_secs(86_400)).unit(Unit::Tokens));
    broker.register_limit("llm", limits).unwrap();
    let spent = ObservedLimit {
        tokens: Some(Observed {
            limit: Some(150_000),
            remaining: Some(0),
            reset: Some(Duration::from_secs(6 * 60)),
            ..Default::default()
        }),
        ..ObservedLimit::default()
    };
    broker.reconcile("llm", &spent).await.unwrap();
    let held = broker.try_acquire("llm", Cost::tokens(1)).await.unwrap();
    assert!(!held.allowed, "the spent counter holds nothing");
    tokio::time::sleep(Duration::from_secs(7 * 60)).await;
    let a = broker
        .try_acquire("llm", Cost::tokens(100_000))
        .await
        .unwrap();
    assert!(
        a.allowed,
        "refused for {:?}: the per-minute counter drained the day",
        a.wait_time
    );
}
