//! An LLM client under RPM + TPM limits, against a simulated upstream.
//!
//! Each job `enqueue`s one chat call with `reqwest`: the broker reserves the
//! *estimated* tokens, the upstream (a real HTTP server on loopback with the
//! same quotas, counting on receive and answering with OpenAI-style
//! `x-ratelimit-*-requests/-tokens` headers) reports the real usage, and the
//! broker settles the difference, reconciles the headers and, on a 429,
//! penalizes the bucket and retries. A foreign client spends part of the
//! same budget, as another service with the same API key would.
//!
//! Run: `cargo run --example llm_client` (finishes in a few seconds).

use std::time::{Duration, Instant, SystemTime};

use broker_testkit::{HeaderStyle, Quota, Upstream, UpstreamConfig};
use resource_broker::{
    headers, Cost, EnqueueError, Limits, MemoryBackend, Outcome, OutcomeClass, RateLimit,
    ResourceBroker, ResourceConfig, Unit,
};

const JOBS: u64 = 120;
const WORKERS: u64 = 8;
const ESTIMATE: u64 = 600;
const RPM: u64 = 1_200;
const RPM_BURST: u64 = 20;
const TPM: u64 = 300_000;
const TPM_BURST: u64 = 10_000;

/// The tokens job `i` really uses: 200..=600, a fixed pseudo-random spread.
fn actual_tokens(i: u64) -> u64 {
    200 + (i * 7_919) % 401
}

/// One chat call; the upstream charges `tokens` and reports them as usage.
async fn chat(http: &reqwest::Client, url: &str, tokens: u64) -> Outcome<u64, String> {
    let response = match http
        .post(url)
        .header("x-usage-tokens", tokens.to_string())
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return Outcome::transient(e.to_string()),
    };
    let status = response.status().as_u16();
    let observed = headers::parse(response.headers(), SystemTime::now());
    match OutcomeClass::from_status(status) {
        OutcomeClass::Ok => match response.json::<serde_json::Value>().await {
            Ok(body) => {
                let used = body["usage"]["total_tokens"].as_u64().unwrap_or(ESTIMATE);
                Outcome::ok_with_usage(used, Cost::tokens(used)).with_observed(observed)
            }
            Err(e) => Outcome::transient(e.to_string()),
        },
        class => Outcome::failed(class, format!("HTTP {status}"), Some(observed)),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();

    let requests = Quota::per(RPM, Duration::from_secs(60)).burst(RPM_BURST);
    let tokens = Quota::per(TPM, Duration::from_secs(60)).burst(TPM_BURST);
    let upstream = Upstream::start(
        UpstreamConfig::new(requests)
            .tokens(tokens)
            .headers(HeaderStyle::OpenAi),
    )
    .await?;
    // Another service on the same key: 2 requests per second.
    let foreign = upstream.spawn_foreign(Duration::from_millis(500), 1_000);

    let broker = ResourceBroker::new(MemoryBackend::new());
    let limits = Limits::new()
        .rate(RateLimit::per(RPM, Duration::from_secs(60)).with_burst(RPM_BURST))
        .rate(
            RateLimit::per(TPM, Duration::from_secs(60))
                .with_burst(TPM_BURST)
                .unit(Unit::Tokens),
        )
        .max_concurrent(WORKERS as u32);
    broker.register("openai", ResourceConfig::new(limits))?;

    let http = reqwest::Client::builder().no_proxy().build()?;
    let url = format!("{}/v1/chat/completions", upstream.url());
    let started = Instant::now();
    let workers = (0..WORKERS).map(|w| {
        let (broker, http, url) = (broker.clone(), http.clone(), url.clone());
        tokio::spawn(async move {
            let (mut done, mut used, mut failed) = (0u64, 0u64, 0u64);
            for i in (w..JOBS).step_by(WORKERS as usize) {
                let r: Result<u64, EnqueueError<String>> = broker
                    .enqueue("openai", Cost::tokens(ESTIMATE), |_| {
                        chat(&http, &url, actual_tokens(i))
                    })
                    .await;
                match r {
                    Ok(t) => {
                        done += 1;
                        used += t;
                    }
                    Err(e) => {
                        failed += 1;
                        eprintln!("job {i}: {e}");
                    }
                }
            }
            (done, used, failed)
        })
    });
    let (mut done, mut used, mut failed) = (0, 0, 0);
    for w in futures::future::join_all(workers).await {
        let (d, u, f) = w?;
        done += d;
        used += u;
        failed += f;
    }
    let elapsed = started.elapsed();
    foreign.abort();

    let ours = upstream.tally("ours");
    let theirs = upstream.tally("foreign");
    let stats = &broker.stats().resources["openai"];
    let secs = elapsed.as_secs_f64();
    let token_capacity = TPM_BURST as f64 + TPM as f64 * secs / 60.0;
    let request_capacity = RPM_BURST as f64 + RPM as f64 * secs / 60.0;
    println!("{JOBS} jobs by {WORKERS} workers in {secs:.1} s: {done} completed, {failed} failed");
    println!(
        "requests sent: {} ({} × 200, {} × 429); foreign client: {} × 200, {} × 429",
        ours.ok + ours.rejected,
        ours.ok,
        ours.rejected,
        theirs.ok,
        theirs.rejected
    );
    println!(
        "broker: {} local waits, {} upstream 429s penalized, {} retries, {} reconciles",
        stats.local_waits, stats.upstream_429, stats.retries, stats.reconciles
    );
    println!(
        "tokens: {used} used of {} reserved (estimates settled to usage)",
        done * ESTIMATE
    );
    println!(
        "utilization: requests {:.0}% of RPM (ours + foreign), tokens {:.0}% of TPM (ours)",
        100.0 * f64::from(ours.ok + theirs.ok) / request_capacity,
        100.0 * used as f64 / token_capacity
    );
    Ok(())
}
