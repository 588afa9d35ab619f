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

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
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

/// One bucket of the simulated upstream: `capacity` at most, refilled at
/// `per_sec`, counted when a request is received.
struct Bucket {
    level: f64,
    capacity: f64,
    per_sec: f64,
}

impl Bucket {
    fn new(capacity: u64, per_minute: u64) -> Self {
        let capacity = capacity as f64;
        let per_sec = per_minute as f64 / 60.0;
        Self {
            level: capacity,
            capacity,
            per_sec,
        }
    }

    fn refill(&mut self, secs: f64) {
        self.level = (self.level + secs * self.per_sec).min(self.capacity);
    }

    /// Seconds until `cost` is there (0 when it is).
    fn wait(&self, cost: f64) -> f64 {
        ((cost - self.level) / self.per_sec).max(0.0)
    }

    /// What the headers report: the level and, as a Go duration, the time
    /// until the bucket is full again.
    fn report(&self) -> (String, String) {
        let to_full = (self.capacity - self.level) / self.per_sec;
        (
            (self.level.max(0.0) as u64).to_string(),
            format!("{}ms", (to_full * 1e3).ceil()),
        )
    }
}

/// The simulated upstream's quota and what it answered, per client.
struct Upstream {
    buckets: Mutex<(Instant, Bucket, Bucket)>,
    answers: [AtomicU32; 4],
}

/// `POST /v1/chat/completions`: charges one request and the
/// `x-usage-tokens` of the request on receive, or answers 429.
async fn completions(State(up): State<Arc<Upstream>>, request: HeaderMap) -> Response {
    let tokens: f64 = request
        .get("x-usage-tokens")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0.0);
    let foreign = request.contains_key("x-foreign");
    let (status, left) = {
        let mut b = up.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (last, requests, budget) = &mut *b;
        let secs = last.elapsed().as_secs_f64();
        *last = Instant::now();
        requests.refill(secs);
        budget.refill(secs);
        let wait = requests.wait(1.0).max(budget.wait(tokens));
        let status = if wait > 0.0 {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            requests.level -= 1.0;
            budget.level -= tokens;
            StatusCode::OK
        };
        (status, [requests.report(), budget.report()])
    };
    let slot = usize::from(foreign) * 2 + usize::from(status != StatusCode::OK);
    up.answers[slot].fetch_add(1, Ordering::Relaxed);
    let [(requests_left, requests_reset), (tokens_left, tokens_reset)] = left;
    let headers = [
        ("x-ratelimit-limit-requests", RPM_BURST.to_string()),
        ("x-ratelimit-remaining-requests", requests_left),
        ("x-ratelimit-reset-requests", requests_reset),
        ("x-ratelimit-limit-tokens", TPM_BURST.to_string()),
        ("x-ratelimit-remaining-tokens", tokens_left),
        ("x-ratelimit-reset-tokens", tokens_reset),
    ];
    let body = serde_json::json!({ "usage": { "total_tokens": tokens as u64 } });
    (status, headers, body.to_string()).into_response()
}

/// Starts the simulated upstream on a free loopback port; returns its URL.
async fn start_upstream() -> Result<(String, Arc<Upstream>), std::io::Error> {
    let upstream = Arc::new(Upstream {
        buckets: Mutex::new((
            Instant::now(),
            Bucket::new(RPM_BURST, RPM),
            Bucket::new(TPM_BURST, TPM),
        )),
        answers: Default::default(),
    });
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .with_state(upstream.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/chat/completions", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, upstream))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();

    let (url, upstream) = start_upstream().await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    // Another service on the same key: 2 requests per second.
    let foreign = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move {
            loop {
                let _ = http.post(&url).header("x-foreign", "1").send().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });

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

    let [ours_ok, ours_429, theirs_ok, theirs_429] = upstream
        .answers
        .each_ref()
        .map(|n| n.load(Ordering::Relaxed));
    let stats = &broker.stats().resources["openai"];
    let secs = elapsed.as_secs_f64();
    let token_capacity = TPM_BURST as f64 + TPM as f64 * secs / 60.0;
    let request_capacity = RPM_BURST as f64 + RPM as f64 * secs / 60.0;
    println!("{JOBS} jobs by {WORKERS} workers in {secs:.1} s: {done} completed, {failed} failed");
    println!(
        "requests sent: {} ({} × 200, {} × 429); foreign client: {} × 200, {} × 429",
        ours_ok + ours_429,
        ours_ok,
        ours_429,
        theirs_ok,
        theirs_429
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
        100.0 * f64::from(ours_ok + theirs_ok) / request_capacity,
        100.0 * used as f64 / token_capacity
    );
    Ok(())
}
