//! Two worker processes share one upstream quota through Redis.
//!
//! The seed scenario of the quickstart, across processes this time: an
//! upstream allows a burst of 3 and 2 requests per second; workers A and B
//! (separate OS processes) each have four jobs at t = 0. With a bucket per
//! worker they send 6 at once and the upstream refuses some; with one
//! bucket shared through Redis the sends are spaced and every one is
//! accepted. The upstream is a strict server with the same quota, fed the real
//! send times.
//!
//! Times are real (about 3 s in all), so the resource is paced 5 % under
//! the quota (`pacing_margin`) to absorb scheduling jitter between the
//! processes.
//!
//! Run: `REDIS_URL=redis://127.0.0.1:6379/ cargo run --example shared_redis --features redis`
//! (`REDIS_URL` defaults to `redis://127.0.0.1:6379/`; keys live under a
//! fresh prefix and expire by themselves).

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use resource_broker::redis::RedisBackend;
use resource_broker::{Cost, Outcome, ResourceBroker, ResourceConfig};

mod support;

const WORKERS: [&str; 2] = ["A", "B"];
const JOBS_PER_WORKER: usize = 4;

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Ok(worker) = std::env::var("SHARED_REDIS_WORKER") {
        return runtime.block_on(worker_main(&url, &worker));
    }
    runtime.block_on(async {
        RedisBackend::connect(&url)
            .await
            .map_err(|e| format!("no Redis at {url} ({e}); set REDIS_URL"))
    })?;
    println!("Two worker processes, four jobs each; upstream quota: burst 3, 2 req/s");
    println!("(state in Redis at {url})\n");
    println!("{}", support::header(44));
    let prefix = format!("rb-example-{}-{}", std::process::id(), wall_us());
    for shared in [false, true] {
        let sends = run_workers(&url, &prefix, shared)?;
        let row = runtime.block_on(support::row(shared, &sends, Some(2), 44))?;
        println!("{row}");
    }
    Ok(())
}

/// Starts both workers as processes of this example; returns every send
/// time, in µs after the common start.
fn run_workers(
    url: &str,
    prefix: &str,
    shared: bool,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    // Both start their jobs at the same moment, once both are connected.
    let start_at = wall_us() + 500_000;
    let children = WORKERS
        .iter()
        .map(|w| {
            Command::new(&exe)
                .env("SHARED_REDIS_WORKER", w)
                .env(
                    "SHARED_REDIS_MODE",
                    if shared { "shared" } else { "separate" },
                )
                .env("SHARED_REDIS_PREFIX", prefix)
                .env("SHARED_REDIS_START", start_at.to_string())
                .env("REDIS_URL", url)
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut sends = Vec::new();
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(format!("a worker failed: {}", out.status).into());
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(at) = line
                .strip_prefix("SENT ")
                .and_then(|t| t.parse::<u64>().ok())
            {
                sends.push(at.saturating_sub(start_at));
            }
        }
    }
    Ok(sends)
}

/// One worker process: enqueue four jobs at the common start time; print
/// `SENT <unix µs>` as each job reaches the upstream.
async fn worker_main(url: &str, worker: &str) -> Result<(), Box<dyn std::error::Error>> {
    let prefix = std::env::var("SHARED_REDIS_PREFIX")?;
    let shared = std::env::var("SHARED_REDIS_MODE")? == "shared";
    let start_at: u64 = std::env::var("SHARED_REDIS_START")?.parse()?;
    let backend = RedisBackend::builder(url).prefix(prefix).connect().await?;
    let broker = ResourceBroker::new(backend);
    let resource = if shared {
        "quota".to_owned()
    } else {
        format!("quota-{worker}")
    };
    let config = ResourceConfig {
        pacing_margin: 0.05,
        ..ResourceConfig::new(support::seed_quota())
    };
    broker.register(&resource, config)?;
    tokio::time::sleep(Duration::from_micros(start_at.saturating_sub(wall_us()))).await;
    let jobs: Vec<_> = (0..JOBS_PER_WORKER)
        .map(|_| {
            let (broker, resource) = (broker.clone(), resource.clone());
            tokio::spawn(async move {
                broker
                    .enqueue(&resource, Cost::default(), |_| async {
                        Outcome::<u64, ()>::ok(wall_us())
                    })
                    .await
            })
        })
        .collect();
    for job in jobs {
        let sent = job.await?.map_err(|e| format!("{e:?}"))?;
        println!("SENT {sent}");
    }
    Ok(())
}
