//! Issue 41, fairness with weights across replicas: flows of two OS
//! processes on one real redis-server split the resource by weight while
//! both are backlogged. The test re-runs its own binary as the workers
//! (`RB_WORKER` names the flow and its weight, as in `queue_replicas.rs`);
//! both start their load at one wall-clock time `RB_T0` and print `SEND
//! <wall µs>` per call sent; the test counts the sends of each.
//!
//! Real time (Redis keeps real time): scaled to a quota of 20 a second, one
//! at once, for 6 s. Run with `--nocapture` to see the figures.

mod workers;

use std::sync::Mutex;
use std::time::Duration;

use broker_core::clock::micros;
use broker_core::{Cost, Limits, Outcome, RateLimit, ResourceBroker, ResourceConfig, Target};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;
use workers::{run_workers, wall_us};

/// The quota of the tests: 20 a second, one at once.
const RATE: u64 = 20;
/// Calls per process, enqueued at once at `t0`: more than the run sends.
const BACKLOG: u64 = 200;
/// How long the workers run (their calls are given up at the end).
const RUN: Duration = Duration::from_secs(6);
/// The shares are counted from here to the end of the run, both flows
/// backlogged throughout.
const COUNT_FROM: Duration = Duration::from_secs(1);

/// The tests of this file run one at a time: their timings are real.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The sends of one worker's `lines`, µs from `t0`.
fn sends(t0: u64, lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("SEND ")?.parse::<u64>().ok())
        .map(|t| t.saturating_sub(t0))
        .collect()
}

/// In a worker process, runs its role and returns true.
fn as_worker() -> bool {
    let Ok(role) = std::env::var("RB_WORKER") else {
        return false;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name}"));
    let (flow, weight) = role.split_once(':').expect("flow:weight");
    let weight: u32 = weight.parse().expect("weight");
    let (url, t0): (String, u64) = (var("RB_URL"), var("RB_T0").parse().expect("RB_T0"));
    // Ends the harness's `test NAME ... ` line.
    println!();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(flow_worker(flow.to_owned(), weight, url, t0));
    true
}

/// Worker: `BACKLOG` calls of `flow` of `weight`, enqueued at once at
/// `t0` and given up at the end of the run; prints `SEND <wall µs>` per
/// call sent.
async fn flow_worker(flow: String, weight: u32, url: String, t0: u64) {
    let backend = RedisBackend::builder(&url)
        .response_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect");
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new().rate(RateLimit::per_second(RATE).with_burst(1));
    let config = ResourceConfig {
        queue_capacity: 10_000,
        ..ResourceConfig::new(limits)
    };
    broker.register("api", config).expect("register");
    let (now, wall) = (tokio::time::Instant::now(), wall_us());
    let start = now + Duration::from_micros(t0.saturating_sub(wall));
    let flow: &'static str = Box::leak(flow.into_boxed_str());
    let calls: Vec<_> = (0..BACKLOG)
        .map(|_| {
            let broker = broker.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(start).await;
                let target = Target::from("api").flow_weighted(flow, weight);
                let _ = broker
                    .enqueue(target, Cost::default(), |_| async {
                        println!("SEND {}", wall_us());
                        Outcome::<(), std::io::Error>::ok(())
                    })
                    .await;
            })
        })
        .collect();
    tokio::time::sleep_until(start + RUN).await;
    for call in calls {
        call.abort();
        let _ = call.await;
    }
}

/// Runs flows `a` and `b` (`flow:weight`) in two processes; returns the
/// sends of each while both are backlogged, and the share of the quota
/// they used.
fn split(test: &str, a: &str, b: &str) -> (usize, usize, f64) {
    let server = RedisServer::start();
    let (t0, outputs) = run_workers(test, &[a, b], &server.url());
    let (from, to) = (micros(COUNT_FROM), micros(RUN));
    let counted = |lines: &[String]| {
        let s = sends(t0, lines);
        s.iter().filter(|&&t| t >= from && t < to).count()
    };
    let (na, nb) = (counted(&outputs[0]), counted(&outputs[1]));
    let possible = (RATE * (to - from)) as f64 / 1e6;
    (na, nb, (na + nb) as f64 / possible)
}

/// Issue 41's weighted fairness across processes: flow A of weight 3 in
/// one process, flow B of weight 1 in another, both backlogged on one
/// resource: A gets 75% of the sends, within 5 points. Scaled: 20/s for 6 s
/// (about 100 sends counted).
#[test]
fn weights_three_to_one_in_two_processes_split_the_sends_three_to_one() {
    if as_worker() {
        return;
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let test = "weights_three_to_one_in_two_processes_split_the_sends_three_to_one";
    let (a, b, used) = split(test, "tenant-a:3", "tenant-b:1");
    let share = a as f64 / (a + b) as f64;
    eprintln!(
        "weights 3:1, 2 processes: A {a} sends, B {b}: A's share {:.1}% (goal 75%); \
         {:.1}% of the quota used",
        share * 100.0,
        used * 100.0
    );
    assert!(a + b >= 50, "enough sends counted: {}", a + b);
    assert!((share - 0.75).abs() <= 0.05, "A's share {share:.3}");
}

/// Equal weights across processes split the sends evenly: each flow's
/// share within 5 points of 50%.
#[test]
fn equal_weights_in_two_processes_split_the_sends_evenly() {
    if as_worker() {
        return;
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let test = "equal_weights_in_two_processes_split_the_sends_evenly";
    let (a, b, used) = split(test, "tenant-a:1", "tenant-b:1");
    let share = a as f64 / (a + b) as f64;
    eprintln!(
        "weights 1:1, 2 processes: A {a} sends, B {b}: A's share {:.1}% (goal 50%); \
         {:.1}% of the quota used",
        share * 100.0,
        used * 100.0
    );
    assert!(a + b >= 50, "enough sends counted: {}", a + b);
    assert!((share - 0.5).abs() <= 0.05, "A's share {share:.3}");
}

/// The failure policy's store hands on its primary's ledger; while Redis
/// is out of reach the ledger fails, and weighted flows go by the local
/// order alone: every call is served (by the local fallback), none fails
/// on the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_flows_go_by_the_local_order_while_redis_is_down() {
    if std::env::var("RB_WORKER").is_ok() {
        return;
    }
    let mut server = RedisServer::start();
    let backend = RedisBackend::builder(&server.url())
        .response_timeout(Duration::from_millis(500))
        .connect_with_policy(broker_core::FailurePolicy::local_fallback(
            0.5,
            broker_memory::MemoryBackend::new(),
        ))
        .await
        .expect("connect");
    assert!(broker_core::Store::turns(&backend).is_some());
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new().rate(RateLimit::per_second(200).with_burst(4));
    broker
        .register("api", ResourceConfig::new(limits))
        .expect("register");
    server.kill();
    let calls: Vec<_> = [("tenant-a", 3), ("tenant-b", 1)]
        .into_iter()
        .flat_map(|flow| std::iter::repeat_n(flow, 10))
        .map(|(flow, weight)| {
            let broker = broker.clone();
            tokio::spawn(async move {
                let target = Target::from("api").flow_weighted(flow, weight);
                broker
                    .enqueue(target, Cost::default(), |_| async {
                        Outcome::<(), std::io::Error>::ok(())
                    })
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    for call in calls {
        let done = tokio::time::timeout(Duration::from_secs(10), call).await;
        done.expect("served in time")
            .expect("caller")
            .expect("served");
    }
}
