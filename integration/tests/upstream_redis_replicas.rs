//! Two replicas share one upstream quota through one Redis, while a
//! foreign client spends 30% of the same budget. With the upstream's
//! headers reconciled into the shared bucket, the upstream refuses fewer
//! requests than with penalize-only, measured in the same run; and no job
//! is lost: every one completes or returns a typed error.
//!
//! Real time (Redis keeps real time); a few seconds. Run with
//! `--nocapture` to see the figures.

mod upstream_support;

use std::time::Duration;

use broker_core::{Cost, EnqueueError, Limits, RateLimit, ResourceBroker, ResourceConfig};
use broker_redis::RedisBackend;
use broker_testkit::{Quota, RedisServer, Upstream, UpstreamConfig};
use upstream_support::{call_now, http_client, Headers};

const QUOTA_PER_SECOND: u64 = 100;
const BURST: u64 = 10;
const JOBS_PER_REPLICA: u64 = 150;
const WORKERS_PER_REPLICA: u64 = 4;

struct Run {
    completed: u64,
    typed_errors: u64,
    ok: u32,
    rejected: u32,
    foreign_ok: u32,
    secs: f64,
}

impl Run {
    fn per_thousand(&self) -> f64 {
        self.rejected as f64 * 1000.0 / f64::from(self.ok + self.rejected)
    }
}

async fn replica(url: &str, resource: &str) -> ResourceBroker {
    let broker = ResourceBroker::new(RedisBackend::connect(url).await.expect("redis"));
    let limits = Limits::new()
        .rate(RateLimit::per(QUOTA_PER_SECOND, Duration::from_secs(1)).with_burst(BURST));
    broker
        .register(resource, ResourceConfig::new(limits))
        .unwrap();
    broker
}

async fn run(redis_url: &str, resource: &str, mode: Headers) -> Run {
    let quota = Quota::per(QUOTA_PER_SECOND, Duration::from_secs(1)).burst(BURST);
    // Resets in milliseconds: at 100/s a whole second would be ten windows.
    let upstream = Upstream::start(UpstreamConfig::new(quota).precise_seconds(true))
        .await
        .unwrap();
    // 30% of 100/s: one every 33⅓ ms.
    let foreign = upstream.spawn_foreign(Duration::from_micros(33_333), 100_000);
    let replicas = [
        replica(redis_url, resource).await,
        replica(redis_url, resource).await,
    ];
    let http = http_client();
    let url = format!("{}/data", upstream.url());
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for broker in &replicas {
        for _ in 0..WORKERS_PER_REPLICA {
            let (broker, http, url, resource) = (
                broker.clone(),
                http.clone(),
                url.clone(),
                resource.to_owned(),
            );
            tasks.push(tokio::spawn(async move {
                let (mut completed, mut typed) = (0u64, 0u64);
                for _ in 0..JOBS_PER_REPLICA / WORKERS_PER_REPLICA {
                    let r: Result<u64, EnqueueError<String>> = broker
                        .enqueue(resource.as_str(), Cost::default(), |_| {
                            call_now(&http, &url, 0, mode)
                        })
                        .await;
                    match r {
                        Ok(_) => completed += 1,
                        Err(_) => typed += 1,
                    }
                }
                (completed, typed)
            }));
        }
    }
    let mut out = Run {
        completed: 0,
        typed_errors: 0,
        ok: 0,
        rejected: 0,
        foreign_ok: 0,
        secs: 0.0,
    };
    for t in tasks {
        let (c, e) = t.await.expect("worker");
        out.completed += c;
        out.typed_errors += e;
    }
    out.secs = started.elapsed().as_secs_f64();
    foreign.abort();
    let ours = upstream.tally("ours");
    out.ok = ours.ok;
    out.rejected = ours.rejected;
    out.foreign_ok = upstream.tally("foreign").ok;
    out
}

/// Rounds of the pair of runs: the 429s differ from run to run by a few,
/// so the two modes are compared over the sum of six rounds.
const ROUNDS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_a_foreign_client_get_fewer_429s_with_reconcile() {
    let redis = RedisServer::start();
    let url = redis.url();
    let jobs = 2 * (JOBS_PER_REPLICA / WORKERS_PER_REPLICA) * WORKERS_PER_REPLICA;
    let (mut off_rejected, mut on_rejected) = (0, 0);
    for round in 0..ROUNDS {
        let (off_id, on_id) = (
            format!("shared-penalize-only-{round}"),
            format!("shared-reconcile-{round}"),
        );
        let (off, on) = tokio::join!(
            run(&url, &off_id, Headers::Ignore),
            run(&url, &on_id, Headers::Reconcile)
        );
        for (name, r) in [("penalize only", &off), ("with reconcile", &on)] {
            println!(
                "{name:>15}: {jobs} jobs on 2 replicas in {:.1} s: {} completed, {} typed errors; \
                 upstream: {} × 200, {} × 429 ({:.1} per 1,000); foreign {} × 200",
                r.secs,
                r.completed,
                r.typed_errors,
                r.ok,
                r.rejected,
                r.per_thousand(),
                r.foreign_ok
            );
            assert_eq!(r.completed + r.typed_errors, jobs, "{name}: a job was lost");
        }
        assert!(off.rejected > 0, "the foreign client must cause 429s");
        off_rejected += off.rejected;
        on_rejected += on.rejected;
    }
    println!(
        "429s over {ROUNDS} rounds: {on_rejected} with reconcile, {off_rejected} penalize-only"
    );
    assert!(
        on_rejected < off_rejected,
        "429s over {ROUNDS} rounds: {on_rejected} with reconcile, {off_rejected} penalize-only"
    );
}
