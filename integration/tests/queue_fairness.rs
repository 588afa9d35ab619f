//! Issue 41, fairness: flows (tenants) of one priority are served by
//! deficit round robin, weighted. A tenant's 10,000 jobs enqueued at once
//! do not hold back another tenant's 10 jobs behind its backlog; with
//! weights 3:1, throughput splits 3:1 while both are backlogged. Memory
//! store, tokio's paused time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::{
    Cost, Limits, Outcome, RateLimit, ResourceBroker, ResourceConfig, Target, TokioClock,
};
use broker_memory::MemoryBackend;
use tokio::time::Instant;

/// 100 a minute, one at once.
fn broker(capacity: usize) -> ResourceBroker {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    let limits = Limits::new().rate(RateLimit::per_minute(100).with_burst(1));
    let config = ResourceConfig {
        queue_capacity: capacity,
        ..ResourceConfig::new(limits)
    };
    broker.register("api", config).unwrap();
    broker
}

type Log = Arc<Mutex<Vec<(&'static str, Duration)>>>;

/// Spawns `n` jobs of `tenant` (of `weight`), logging their send times.
fn jobs(
    broker: &ResourceBroker,
    (tenant, weight): (&'static str, u32),
    n: usize,
    log: &Log,
    t0: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (broker, log) = (broker.clone(), log.clone());
            tokio::spawn(async move {
                let target = Target::from("api").flow_weighted(tenant, weight);
                broker
                    .enqueue(target, Cost::default(), |_| {
                        let log = log.clone();
                        async move {
                            log.lock().unwrap().push((tenant, t0.elapsed()));
                            Outcome::<(), ()>::ok(())
                        }
                    })
                    .await
                    .unwrap();
            })
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_small_tenant_does_not_wait_for_a_big_tenants_backlog() {
    let broker = broker(20_000);
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let a = jobs(&broker, ("tenant-a", 1), 10_000, &log, t0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let arrived = t0.elapsed();
    let b = jobs(&broker, ("tenant-b", 1), 10, &log, t0);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The busiest flows are shown by fingerprint, never by name.
    let stats = broker.stats().resources["api"].queue.clone();
    assert_eq!(stats.busiest_flows.len(), 2);
    assert!(stats.busiest_flows[0].queued > 9_000);
    assert!(stats
        .busiest_flows
        .iter()
        .all(|f| !f.flow.contains("tenant") && f.flow.len() == 16));
    for job in b {
        job.await.unwrap();
    }
    let took = t0.elapsed() - arrived;
    // Fair share: half of 100 a minute, 10 jobs in 12 s.
    let fair = Duration::from_secs(12);
    println!("tenant B's 10 jobs took {took:?} (fair share {fair:?})");
    assert!(took <= 2 * fair, "B's jobs took {took:?}");
    for job in a {
        job.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn weights_three_to_one_split_throughput_three_to_one() {
    let broker = broker(5_000);
    let t0 = Instant::now();
    let log: Log = Arc::default();
    let a = jobs(&broker, ("tenant-a", 3), 2_000, &log, t0);
    let b = jobs(&broker, ("tenant-b", 1), 2_000, &log, t0);
    // Both stay backlogged for 10 minutes (1,000 sends).
    tokio::time::sleep(Duration::from_secs(600)).await;
    let sends = log.lock().unwrap().clone();
    let to_a = sends.iter().filter(|(t, _)| *t == "tenant-a").count() as f64;
    let to_b = sends.iter().filter(|(t, _)| *t == "tenant-b").count() as f64;
    let ratio = to_a / to_b;
    println!("weights 3:1: {to_a} to A, {to_b} to B, ratio {ratio:.3}");
    assert!(to_a + to_b >= 990.0);
    assert!((ratio - 3.0).abs() <= 0.15, "ratio {ratio}");
    for job in a.into_iter().chain(b) {
        job.abort();
    }
}

/// A flood of new flow keys is bounded by the queue's capacity: the calls
/// beyond it get `QueueFull` at once, the stats show ten flows at most,
/// and once the callers are gone no flow is left.
#[tokio::test(start_paused = true)]
async fn a_flood_of_flow_keys_is_bounded_by_the_queue_capacity() {
    use broker_core::{BrokerError, EnqueueError};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let broker = broker(50);
    let full = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for i in 0..1_000 {
        let (broker, full) = (broker.clone(), full.clone());
        callers.push(tokio::spawn(async move {
            let flow = format!("tenant-{i}");
            let target = Target::from("api").flow(&flow);
            let result = broker
                .enqueue(target, Cost::default(), |_| async {
                    Outcome::<(), ()>::ok(())
                })
                .await;
            if let Err(EnqueueError::Broker(BrokerError::QueueFull { .. })) = result {
                full.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    let stats = broker.stats().resources["api"].clone();
    assert_eq!(stats.queued, 50);
    // All but the first (sent at once) and the 50 queued.
    assert_eq!(full.load(Ordering::Relaxed), 1_000 - 50 - 1);
    assert_eq!(stats.queue.busiest_flows.len(), 10);
    for c in &callers {
        c.abort();
    }
    for c in callers {
        let _ = c.await;
    }
    let after = broker.stats().resources["api"].clone();
    assert_eq!(after.queued, 0);
    assert!(after.queue.busiest_flows.is_empty());
    assert!(after.queue.levels.iter().all(|l| l.depth == 0));
}
