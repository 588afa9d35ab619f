//! resource-broker in one process, no services needed.
//!
//! 1. The seed scenario: two workers, four jobs each, against an upstream
//!    that allows a burst of 3 and 2 requests per second. With a bucket per
//!    worker they send 6 at once and half are refused; with one shared
//!    bucket every request is accepted.
//! 2. Check + reject: `try_acquire` denies with the wait until the next slot.
//! 3. Queue + execute: `enqueue` paces an LLM-style batch under RPM + TPM
//!    limits and settles the real token usage after each call.
//!
//! Waits run on tokio's paused clock, so the demo takes well under a second
//! while the broker sees the same times it would in production.
//!
//! Run: `cargo run --example quickstart`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use resource_broker::{
    Cost, Limits, MemoryBackend, Outcome, RateLimit, ResourceBroker, ResourceConfig, TokioClock,
    Unit,
};
use tokio::time::Instant;

mod support;

/// Runs in virtual time: the waits are real to the broker, instant to you.
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("1. Two workers, four jobs each; upstream quota: burst 3, 2 req/s\n");
    println!("{}", support::header(36));
    for shared in [false, true] {
        let sends = seed_run(shared).await?;
        println!("{}", support::row(shared, &sends, None, 36).await?);
    }

    println!("\n2. Check + reject: a webhook endpoint limited to 5 req/s\n");
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(5)))?;
    for request in 1..=7 {
        let a = broker.try_acquire("webhooks", Cost::default()).await?;
        if a.allowed {
            println!("   request {request}: accepted");
        } else {
            println!("   request {request}: 429, Retry-After {:?}", a.wait_time);
        }
    }

    println!("\n3. Queue + execute: 20 LLM calls under 60 RPM and 10,000 TPM,");
    println!("   1,500 tokens estimated per call, 600-1,100 really used\n");
    for settle in [false, true] {
        let (elapsed, used, waits) = llm_batch(settle).await?;
        let label = if settle {
            "settled to real usage"
        } else {
            "charged the estimate"
        };
        println!(
            "   {label:<22} done in {:>5.1} s, {used} tokens used, {waits} paced waits",
            elapsed.as_secs_f64()
        );
    }
    Ok(())
}

/// Twenty calls through `enqueue`; with `settle`, each reports its real
/// token usage and the difference to the estimate is refunded.
async fn llm_batch(settle: bool) -> Result<(Duration, u64, u64), Box<dyn std::error::Error>> {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    let limits = Limits::new()
        .rate(RateLimit::per_minute(60).with_burst(5))
        .rate(RateLimit::per(10_000, Duration::from_secs(60)).unit(Unit::Tokens));
    broker.register("llm", ResourceConfig::new(limits))?;
    let start = Instant::now();
    let mut calls = Vec::new();
    for call in 0..20u64 {
        let broker = broker.clone();
        calls.push(tokio::spawn(async move {
            broker
                .enqueue("llm", Cost::tokens(1_500), move |_| async move {
                    // The upstream reports real usage only in its response.
                    let used = 600 + (call * 97) % 500;
                    let usage = settle.then_some(Cost::tokens(used));
                    Outcome::<(Duration, u64), std::io::Error>::Ok {
                        value: (start.elapsed(), used),
                        usage,
                        observed: None,
                    }
                })
                .await
        }));
        tokio::task::yield_now().await;
    }
    let (mut used_total, mut last) = (0, Duration::ZERO);
    for call in calls {
        let (at, used) = call.await??;
        used_total += used;
        last = last.max(at);
    }
    let waits = broker.stats().resources["llm"].local_waits;
    Ok((last, used_total, waits))
}

/// Both workers enqueue four jobs in turn; returns when each job was sent
/// (µs after start).
async fn seed_run(shared: bool) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    let quota = support::seed_quota();
    for name in ["shared", "worker-A", "worker-B"] {
        broker.register(name, ResourceConfig::new(quota.clone()))?;
    }
    let start = Instant::now();
    let sends = Arc::new(Mutex::new(Vec::new()));
    let mut jobs = Vec::new();
    for _job in 0..4 {
        for worker in ["A", "B"] {
            let resource = if shared {
                "shared".to_owned()
            } else {
                format!("worker-{worker}")
            };
            let (broker, sends) = (broker.clone(), sends.clone());
            jobs.push(tokio::spawn(async move {
                broker
                    .enqueue(&resource, Cost::default(), |_| {
                        let sends = sends.clone();
                        async move {
                            sends
                                .lock()
                                .unwrap()
                                .push(start.elapsed().as_micros() as u64);
                            Outcome::<(), ()>::ok(())
                        }
                    })
                    .await
            }));
            tokio::task::yield_now().await;
        }
    }
    for job in jobs {
        job.await?.map_err(|e| format!("{e:?}"))?;
    }
    let sends = sends.lock().unwrap().clone();
    Ok(sends)
}
