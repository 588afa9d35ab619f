//! An LLM client under RPM + TPM limits, against a simulated OpenAI-style
//! upstream that counts on receive and answers with `x-ratelimit-*` headers.
//!
//! 1. A batch: the broker books the *estimated* tokens, settles them to the
//!    real usage, narrows its buckets to the headers and, on a 429,
//!    penalizes the bucket and retries; a foreign client spends part of the
//!    same budget, as another service on the same API key would.
//! 2. Priorities: interactive calls overtake a queued batch.
//! 3. Flows: a small tenant does not wait for a big tenant's backlog.
//!
//! Waits run on tokio's paused clock: the broker sees the times it would in
//! production, the demo ends in about a second.
//!
//! Run: `cargo run --example llm_client`

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use resource_broker::headers::{self, HeaderMap, HeaderValue};
use resource_broker::{
    Cost, Limits, MemoryBackend, Outcome, OutcomeClass, Priority, RateLimit, ResourceBroker,
    ResourceConfig, Target, TokioClock, Unit,
};
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};

const RPM: u64 = 600;
const TPM: u64 = 150_000;
const ESTIMATE: u64 = 600;

/// Runs in virtual time: the waits are real to the broker, instant to you.
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    batch_with_feedback().await?;
    interactive_overtakes_a_batch().await?;
    a_small_tenant_beside_a_big_one().await?;
    Ok(())
}

/// The tokens job `i` really uses: 200..=600, a fixed pseudo-random spread.
fn actual_tokens(i: u64) -> u64 {
    200 + (i * 7_919) % 401
}

/// A broker on tokio's clock with one resource, `name`, under `limits`.
fn broker_with(name: &str, limits: Limits) -> Result<ResourceBroker, Box<dyn std::error::Error>> {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    broker.register(name, ResourceConfig::new(limits))?;
    Ok(broker)
}

/// RPM and TPM with bursts of a second's worth, as OpenAI-style quotas behave.
fn openai_limits() -> Limits {
    Limits::new()
        .rate(RateLimit::per(RPM, Duration::from_secs(60)).with_burst(RPM / 60))
        .rate(
            RateLimit::per(TPM, Duration::from_secs(60))
                .with_burst(TPM / 60)
                .unit(Unit::Tokens),
        )
}

/// Part 1: 120 jobs through `enqueue`, 8 at a time, beside a foreign client.
async fn batch_with_feedback() -> Result<(), Box<dyn std::error::Error>> {
    println!("1. 120 chat calls under {RPM} RPM and {TPM} TPM, a foreign client on the same key\n");
    let broker = broker_with("openai", openai_limits().max_concurrent(8))?;
    let upstream = Upstream::new();
    let foreign = tokio::spawn({
        let upstream = upstream.clone();
        async move {
            loop {
                upstream.call(300, true);
                sleep(Duration::from_millis(250)).await;
            }
        }
    });
    let started = Instant::now();
    let mut jobs = JoinSet::new();
    for i in 0..120 {
        let (broker, upstream) = (broker.clone(), upstream.clone());
        jobs.spawn(async move {
            broker
                .enqueue("openai", Cost::tokens(ESTIMATE), |_| {
                    let answer = upstream.call(actual_tokens(i), false);
                    async move { answer }
                })
                .await
        });
    }
    let (mut done, mut used) = (0, 0);
    while let Some(job) = jobs.join_next().await {
        if let Ok(tokens) = job? {
            done += 1;
            used += tokens;
        }
    }
    foreign.abort();
    let secs = started.elapsed().as_secs_f64();
    let stats = &broker.stats().resources["openai"];
    let answers = upstream.answers();
    println!(
        "   {done} of 120 done in {secs:.1} s; {used} tokens used of {} estimated",
        120 * ESTIMATE
    );
    println!(
        "   upstream answered ours {} × 200, {} × 429; the foreign client's {} × 200, {} × 429",
        answers[0], answers[1], answers[2], answers[3]
    );
    println!(
        "   broker: {} upstream 429s penalized, {} retries, {} reconciles\n",
        stats.upstream_429, stats.retries, stats.reconciles
    );
    Ok(())
}

/// Part 2: 300 batch jobs queued at once, 60 a minute; an interactive call
/// every 20 s waits for one token interval at most, not for the batch.
async fn interactive_overtakes_a_batch() -> Result<(), Box<dyn std::error::Error>> {
    println!("2. 300 batch jobs queued at 60 RPM; an interactive call every 20 s\n");
    let limit = Limits::new().rate(RateLimit::per_minute(60).with_burst(1));
    let broker = broker_with("embeddings", limit)?;
    let mut batch = JoinSet::new();
    for _ in 0..300 {
        let broker = broker.clone();
        batch.spawn(async move {
            let target = Target::from("embeddings").priority(Priority::Batch);
            broker
                .enqueue(target, Cost::default(), |_| async {
                    Outcome::<(), std::io::Error>::ok(())
                })
                .await
        });
    }
    for n in 1..=5 {
        sleep(Duration::from_secs(20)).await;
        let asked = Instant::now();
        let target = Target::from("embeddings").priority(Priority::Interactive);
        broker
            .enqueue(target, Cost::default(), |_| async {
                Outcome::<(), std::io::Error>::ok(())
            })
            .await?;
        let queue = &broker.stats().resources["embeddings"].queue;
        println!(
            "   interactive call {n}: answered after {:.1} s, {} batch jobs still queued",
            asked.elapsed().as_secs_f64(),
            queue
                .levels
                .iter()
                .find(|l| l.priority == "batch")
                .map_or(0, |l| l.depth)
        );
    }
    batch.abort_all();
    println!("   (behind the batch at one priority it would have waited up to 300 s)\n");
    Ok(())
}

/// Part 3: tenant A queues 600 jobs, tenant B 10 a second later, at 100
/// RPM; B is served beside A, not after A's 6 minutes of backlog.
async fn a_small_tenant_beside_a_big_one() -> Result<(), Box<dyn std::error::Error>> {
    println!("3. Tenant A queues 600 jobs, tenant B 10 jobs a second later, at 100 RPM\n");
    let limit = Limits::new().rate(RateLimit::per_minute(100).with_burst(1));
    let broker = broker_with("chat", limit)?;
    let started = Instant::now();
    let mut a = JoinSet::new();
    for _ in 0..600 {
        let broker = broker.clone();
        a.spawn(async move {
            let target = Target::from("chat").flow("tenant-a");
            broker
                .enqueue(target, Cost::default(), |_| async {
                    Outcome::<(), std::io::Error>::ok(())
                })
                .await
        });
    }
    sleep(Duration::from_secs(1)).await;
    let mut b = JoinSet::new();
    for _ in 0..10 {
        let broker = broker.clone();
        b.spawn(async move {
            let target = Target::from("chat").flow("tenant-b");
            broker
                .enqueue(target, Cost::default(), |_| async {
                    Outcome::<(), std::io::Error>::ok(())
                })
                .await
        });
    }
    sleep(Duration::from_millis(100)).await;
    let queue = &broker.stats().resources["chat"].queue;
    for flow in &queue.busiest_flows {
        println!(
            "   queued: flow {} (a fingerprint) {} jobs",
            flow.flow, flow.queued
        );
    }
    while let Some(job) = b.join_next().await {
        job??;
    }
    let b_done = started.elapsed().as_secs_f64();
    a.abort_all();
    println!("   tenant B's 10 jobs done at {b_done:.1} s (its fair half of 100 RPM: 12 s)");
    println!("   behind tenant A's backlog, as one flow, B would have waited about 360 s");
    Ok(())
}

/// One bucket of the simulated upstream, counted on receive.
#[derive(Debug)]
struct Bucket {
    level: f64,
    capacity: f64,
    per_sec: f64,
}

impl Bucket {
    fn new(capacity: u64, per_minute: u64) -> Self {
        let capacity = capacity as f64;
        Self {
            level: capacity,
            capacity,
            per_sec: per_minute as f64 / 60.0,
        }
    }

    fn refill(&mut self, secs: f64) {
        self.level = (self.level + secs * self.per_sec).min(self.capacity);
    }

    /// What the headers report: the level and, as a Go duration, the time
    /// until the bucket is full again.
    fn report(&self) -> (String, String) {
        let to_full = (self.capacity - self.level) / self.per_sec;
        let level = self.level.max(0.0) as u64;
        (level.to_string(), format!("{}ms", (to_full * 1e3).ceil()))
    }
}

/// The simulated upstream: RPM and TPM buckets, and what it answered
/// (ours 200, ours 429, foreign 200, foreign 429).
#[derive(Debug, Clone)]
struct Upstream(Arc<Mutex<UpstreamState>>);

/// The last receive time, the RPM and TPM buckets, the answers counted.
type UpstreamState = (Instant, Bucket, Bucket, [u32; 4]);

impl Upstream {
    fn new() -> Self {
        let (rpm, tpm) = (Bucket::new(RPM / 60, RPM), Bucket::new(TPM / 60, TPM));
        Self(Arc::new(Mutex::new((Instant::now(), rpm, tpm, [0; 4]))))
    }

    fn answers(&self) -> [u32; 4] {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).3
    }

    /// One chat call that uses `tokens`: 200 with the usage, or 429.
    fn call(&self, tokens: u64, foreign: bool) -> Outcome<u64, String> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (last, requests, budget, answers) = &mut *guard;
        let secs = last.elapsed().as_secs_f64();
        *last = Instant::now();
        requests.refill(secs);
        budget.refill(secs);
        let ok = requests.level >= 1.0 && budget.level >= tokens as f64;
        if ok {
            requests.level -= 1.0;
            budget.level -= tokens as f64;
        }
        answers[usize::from(foreign) * 2 + usize::from(!ok)] += 1;
        let mut headers = HeaderMap::new();
        let ((r_left, r_reset), (t_left, t_reset)) = (requests.report(), budget.report());
        for (name, value) in [
            ("x-ratelimit-limit-requests", (RPM / 60).to_string()),
            ("x-ratelimit-remaining-requests", r_left),
            ("x-ratelimit-reset-requests", r_reset),
            ("x-ratelimit-limit-tokens", (TPM / 60).to_string()),
            ("x-ratelimit-remaining-tokens", t_left),
            ("x-ratelimit-reset-tokens", t_reset),
        ] {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(name, value);
            }
        }
        let observed = headers::parse(&headers, SystemTime::now());
        if ok {
            Outcome::ok_with_usage(tokens, Cost::tokens(tokens)).with_observed(observed)
        } else {
            let class = OutcomeClass::from_status(429);
            Outcome::failed(class, "HTTP 429".to_owned(), Some(observed))
        }
    }
}
