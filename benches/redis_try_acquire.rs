//! `ResourceBroker::try_acquire` through `RedisBackend`: decisions per
//! second, latency, and Redis commands per decision (`INFO commandstats`),
//! with 1 and 50 acquisitions in flight on one key.
//!
//! A throughput run rather than a criterion loop, so that its figures line
//! up with `redis-benchmark` and rate-limiter-flexible's, which
//! `bench/redis_compare.sh` runs against the same server. Alone it starts
//! its own `redis-server`:
//!
//! `cargo bench -p resource-broker-benches --bench redis_try_acquire`
//!
//! Each run is done three times: through the broker (coalescing on, the
//! default), through the broker with coalescing off (one `EVALSHA` per
//! decision), and as a client-side anchor,
//! `bench/token_bucket.lua` (the minimal script `redis-benchmark` runs) by
//! `EVALSHA` through the same `redis` crate connection type
//! (`ConnectionManager`) that RedisBackend uses: the gap between the two is
//! our script and our layers, not the client library.
//!
//! Env: `REDIS_URL` (use that server instead), `INFLIGHT` (default
//! `1,50`), `RUN_SECONDS` per run (default 3), `RUNTIME` (`current_thread`,
//! the default, one client core like Node; or `multi_thread`),
//! `COALESCE_LIMITS` (`max_batch,max_in_flight`; without it, the
//! backend's defaults), `WHO` (which runs, of `ours`, `off`, `minimal`,
//! separated by commas; default all three: to profile one client alone).
//! Prints one JSON line per run. With coalescing, one `EVALSHA` carries
//! several decisions when many are in flight: `commands_per_decision.evalsha`
//! is then below 1, and `decisions_per_evalsha` gives the batch size;
//! `server_usec_per_decision` is the `EVALSHA` time per decision.
//! `client_cpu_us_per_decision` is the CPU time of the whole bench process
//! (user and system, from `/proc/self/stat`, in 10 ms ticks) during the
//! run, per decision: on the default single-threaded runtime, the client's
//! work.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;

/// Same quota as the other runs: a burst large enough that every call is
/// allowed, at a rate low enough that the bucket is never full again (so
/// every decision writes the bucket back rather than deleting it).
fn limits() -> Limits {
    Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000_000))
}

struct Run {
    decisions: u64,
    allowed: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    /// CPU time of the process during the run, if `/proc` tells.
    cpu: Option<Duration>,
}

/// CPU time (user and system) of this process so far, from `/proc/self/stat`
/// (in ticks of 1/100 s, Linux's `USER_HZ`); `None` elsewhere.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses): state is
    // field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Runs `decide` from `inflight` concurrent loops for `length`.
async fn run<F, Fut>(decide: F, inflight: usize, length: Duration) -> Run
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + length;
    let worker = || async {
        let mut latencies = Vec::with_capacity(1 << 16);
        let mut allowed = 0u64;
        while Instant::now() < end {
            let t0 = Instant::now();
            allowed += u64::from(decide().await);
            latencies.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
        }
        (allowed, latencies)
    };
    let cpu_before = process_cpu();
    let started = Instant::now();
    let results = futures::future::join_all((0..inflight).map(|_| worker())).await;
    let elapsed = started.elapsed();
    let cpu = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let mut latencies_us = Vec::new();
    let mut allowed = 0;
    for (a, l) in results {
        allowed += a;
        latencies_us.extend(l);
    }
    Run {
        decisions: latencies_us.len() as u64,
        allowed,
        elapsed,
        latencies_us,
        cpu,
    }
}

/// A field (`calls`, `usec`, `usec_per_call`) of `cmdstat_evalsha`.
fn evalsha_field(info: &str, field: &str) -> Option<f64> {
    let line = info
        .lines()
        .find(|l| l.trim().starts_with("cmdstat_evalsha:"))?;
    line.trim()
        .trim_start_matches("cmdstat_evalsha:")
        .split(',')
        .find_map(|f| f.strip_prefix(field)?.strip_prefix('='))?
        .trim()
        .parse()
        .ok()
}

fn commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("cmdstat_")?;
            let (name, fields) = rest.split_once(':')?;
            let calls = fields.strip_prefix("calls=")?.split(',').next()?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        // The control connection's own commands (`config|resetstat`, `info`).
        .filter(|(name, _)| !name.starts_with("config") && !name.starts_with("info"))
        .collect()
}

fn report(who: &str, runtime: &str, n: usize, mut r: Run, info: &str) {
    let per_decision: BTreeMap<String, f64> = commandstats(info)
        .into_iter()
        .map(|(k, v)| {
            let per = v as f64 / r.decisions as f64;
            (k, (per * 1000.0).round() / 1000.0)
        })
        .collect();
    r.latencies_us.sort_unstable();
    let pct = |p: f64| {
        let i = ((r.latencies_us.len() as f64 * p) as usize).min(r.latencies_us.len() - 1);
        r.latencies_us[i]
    };
    let mean =
        r.latencies_us.iter().map(|&l| f64::from(l)).sum::<f64>() / r.latencies_us.len() as f64;
    println!(
        "{}",
        serde_json::json!({
            "who": who,
            "runtime": runtime,
            "inflight": n,
            "decisions": r.decisions,
            "allowed": r.allowed,
            "per_sec": (r.decisions as f64 / r.elapsed.as_secs_f64()).round(),
            "mean_us": (mean * 10.0).round() / 10.0,
            "p50_us": pct(0.5),
            "p99_us": pct(0.99),
            "commands_per_decision": per_decision,
            // With coalescing one EVALSHA carries several decisions: both
            // ways round, and the server's time per EVALSHA and per decision.
            "decisions_per_evalsha": evalsha_field(info, "calls")
                .map(|c| (r.decisions as f64 / c * 100.0).round() / 100.0),
            "evalsha_usec_per_call": evalsha_field(info, "usec_per_call"),
            "server_usec_per_decision": evalsha_field(info, "usec")
                .map(|u| (u / r.decisions as f64 * 100.0).round() / 100.0),
            "client_cpu_us_per_decision": r.cpu
                .map(|c| (c.as_secs_f64() * 1e6 / r.decisions as f64 * 100.0).round() / 100.0),
            "client_cpu_share": r.cpu
                .map(|c| (c.as_secs_f64() / r.elapsed.as_secs_f64() * 1000.0).round() / 1000.0),
        })
    );
}

fn main() {
    let own_server = std::env::var("REDIS_URL").is_err().then(RedisServer::start);
    let url = match &own_server {
        Some(s) => s.url(),
        None => std::env::var("REDIS_URL").expect("checked above"),
    };
    let inflight: Vec<usize> = std::env::var("INFLIGHT")
        .unwrap_or_else(|_| "1,50".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("INFLIGHT: numbers separated by commas")
        })
        .collect();
    let seconds: f64 = std::env::var("RUN_SECONDS")
        .ok()
        .map(|s| s.parse().expect("RUN_SECONDS: a number"))
        .unwrap_or(3.0);
    let runtime = std::env::var("RUNTIME").unwrap_or_else(|_| "current_thread".into());
    let rt = match runtime.as_str() {
        "current_thread" => tokio::runtime::Builder::new_current_thread(),
        "multi_thread" => tokio::runtime::Builder::new_multi_thread(),
        other => panic!("RUNTIME must be current_thread or multi_thread, not {other}"),
    }
    .enable_all()
    .build()
    .expect("tokio runtime");

    rt.block_on(async {
        let mut builder = RedisBackend::builder(&url);
        if let Ok(limits) = std::env::var("COALESCE_LIMITS") {
            let (batch, in_flight) = limits
                .split_once(',')
                .and_then(|(b, f)| Some((b.trim().parse().ok()?, f.trim().parse().ok()?)))
                .expect("COALESCE_LIMITS: max_batch,max_in_flight");
            builder = builder.coalesce_limits(batch, in_flight);
        }
        let broker = ResourceBroker::new(builder.connect().await.expect("connect"));
        broker
            .register_limit("bench", limits())
            .expect("valid limits");
        let uncoalesced = ResourceBroker::new(
            RedisBackend::builder(&url)
                .coalesce(false)
                .connect()
                .await
                .expect("connect"),
        );
        uncoalesced
            .register_limit("bench", limits())
            .expect("valid limits");
        let control = redis::Client::open(url.as_str()).expect("redis url");
        let mut control = control
            .get_multiplexed_async_connection()
            .await
            .expect("control connection");
        let anchor = redis::Client::open(url.as_str()).expect("redis url");
        let anchor = redis::aio::ConnectionManager::new(anchor)
            .await
            .expect("anchor connection");
        let script = redis::Script::new(include_str!("../bench/token_bucket.lua"));
        let ours = || async {
            broker
                .try_acquire("bench", Cost::default())
                .await
                .expect("redis answers")
                .allowed
        };
        let ours_uncoalesced = || async {
            uncoalesced
                .try_acquire("bench", Cost::default())
                .await
                .expect("redis answers")
                .allowed
        };
        let sha: String = script
            .prepare_invoke()
            .load_async(&mut anchor.clone())
            .await
            .expect("SCRIPT LOAD");
        let minimal = || {
            let mut conn = anchor.clone();
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha)
                .arg(1)
                .arg("tb:{anchor}")
                .arg(1_000_000_000u64)
                .arg(0.001f64);
            async move {
                let allowed: i64 = cmd.query_async(&mut conn).await.expect("redis answers");
                allowed == 1
            }
        };
        let selected = std::env::var("WHO").unwrap_or_else(|_| "ours,off,minimal".into());
        let selected: Vec<&str> = selected.split(',').map(str::trim).collect();
        for n in inflight {
            for (short, who) in [
                ("ours", "resource-broker RedisBackend"),
                ("off", "resource-broker RedisBackend coalescing off"),
                ("minimal", "redis-rs minimal script"),
            ] {
                if !selected.contains(&short) {
                    continue;
                }
                let measured = async |length| match who {
                    "resource-broker RedisBackend" => run(ours, n, length).await,
                    "resource-broker RedisBackend coalescing off" => {
                        run(ours_uncoalesced, n, length).await
                    }
                    _ => run(minimal, n, length).await,
                };
                measured(Duration::from_millis(500)).await; // warm-up
                let _: () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query_async(&mut control)
                    .await
                    .expect("CONFIG RESETSTAT");
                let r = measured(Duration::from_secs_f64(seconds)).await;
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(&mut control)
                    .await
                    .expect("INFO commandstats");
                report(who, &runtime, n, r, &info);
            }
        }
    });
    drop(own_server);
}
