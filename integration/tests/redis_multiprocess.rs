//! Several OS processes share one quota through one redis-server. The test
//! re-runs its own binary as the workers (`RB_WORKER` names the role), each
//! hammering the same resource for a bounded time and count, and checks the
//! combined result:
//! - `try`: no window admits more than `burst + rate × elapsed + 1`;
//! - `book`: the combined schedule of booked times passes a strict
//!   server with the same quota with zero 429s.
//!
//! Times are on the host's clock, which the redis-server on loopback shares
//! (its `TIME` is the same clock).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broker_core::clock::micros;
use broker_core::{Cost, LimitSpec, Limits, RateLimit, ResourceBroker};
use broker_redis::RedisBackend;
use broker_testkit::{RedisServer, StrictServer};

const PROCESSES: usize = 3;
const TASKS_PER_PROCESS: usize = 4;
const RUN: Duration = Duration::from_millis(1500);
const MAX_CALLS_PER_TASK: usize = 50_000;

const TRY_BURST: u64 = 20;
const TRY_RATE: u64 = 200;
const BOOK_BURST: u64 = 5;
const BOOK_RATE: u64 = 50;

fn wall_us() -> u64 {
    micros(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// Runs this test's binary as `PROCESSES` workers of `test` and returns
/// their stdout lines.
fn run_workers(test: &str, role: &str, url: &str) -> Vec<String> {
    let exe = std::env::current_exe().expect("own test binary");
    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads", "1"])
                .env("RB_WORKER", role)
                .env("RB_WORKER_ID", i.to_string())
                .env("RB_URL", url)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn a worker process")
        })
        .collect();
    let mut lines = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("worker output");
        assert!(out.status.success(), "a worker failed: {:?}", out.status);
        lines.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned),
        );
    }
    lines
}

/// A worker's backend: the server's clock, timeouts generous enough for a
/// loaded test machine.
async fn connect(url: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .response_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect")
}

fn worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Worker: `try_acquire` in a loop from several tasks; prints
/// `ADMIT <sent_us> <recv_us>` per admission and `DENIED <n>`.
fn try_worker(url: &str) {
    worker_runtime().block_on(async {
        let broker = ResourceBroker::new(connect(url).await);
        let limits = Limits::new().rate(RateLimit::per_second(TRY_RATE).with_burst(TRY_BURST));
        broker.register_limit("shared", limits).expect("register");
        let deadline = Instant::now() + RUN;
        let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
            .map(|_| {
                let broker = broker.clone();
                tokio::spawn(async move {
                    let (mut admitted, mut denied) = (Vec::new(), 0u64);
                    for _ in 0..MAX_CALLS_PER_TASK {
                        if Instant::now() >= deadline {
                            break;
                        }
                        let sent = wall_us();
                        let a = broker
                            .try_acquire("shared", Cost::default())
                            .await
                            .expect("try_acquire");
                        if a.allowed {
                            admitted.push((sent, wall_us()));
                        } else {
                            denied += 1;
                        }
                    }
                    (admitted, denied)
                })
            })
            .collect();
        let mut denied = 0;
        for t in tasks {
            let (admitted, d) = t.await.expect("task");
            for (sent, recv) in admitted {
                println!("ADMIT {sent} {recv}");
            }
            denied += d;
        }
        println!("DENIED {denied}");
    });
}

/// Worker: `book` one request at a time per task, sleep until it is
/// due, repeat; prints `BOOKED <absolute us>` on the server's clock.
fn book_worker(url: &str) {
    worker_runtime().block_on(async {
        let backend = connect(url).await;
        let limits = Limits::new().rate(RateLimit::per_second(BOOK_RATE).with_burst(BOOK_BURST));
        let spec = LimitSpec::new(&limits, Duration::from_secs(30));
        let deadline = Instant::now() + RUN;
        let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
            .map(|_| {
                let (backend, spec) = (backend.clone(), spec.clone());
                tokio::spawn(async move {
                    let mut booked = Vec::new();
                    for _ in 0..MAX_CALLS_PER_TASK {
                        if Instant::now() >= deadline {
                            break;
                        }
                        let (r, now) = backend
                            .book_at("shared", &spec, Cost::default(), Duration::from_secs(60))
                            .await
                            .expect("book");
                        assert!(r.booked);
                        booked.push(now + r.wait);
                        tokio::time::sleep(Duration::from_micros(r.wait)).await;
                    }
                    booked
                })
            })
            .collect();
        for t in tasks {
            for at in t.await.expect("task") {
                println!("BOOKED {at}");
            }
        }
    });
}

/// In a worker process, runs the role and returns true.
fn as_worker() -> bool {
    let Ok(role) = std::env::var("RB_WORKER") else {
        return false;
    };
    let url = std::env::var("RB_URL").expect("RB_URL");
    match role.as_str() {
        "try" => try_worker(&url),
        "book" => book_worker(&url),
        other => panic!("unknown worker role {other}"),
    }
    true
}

#[test]
fn try_across_processes_never_admits_more_than_burst_plus_rate_times_elapsed() {
    if as_worker() {
        return;
    }
    let server = RedisServer::start();
    let lines = run_workers(
        "try_across_processes_never_admits_more_than_burst_plus_rate_times_elapsed",
        "try",
        &server.url(),
    );
    let admitted: Vec<(u64, u64)> = lines
        .iter()
        .filter_map(|l| {
            let mut it = l.strip_prefix("ADMIT ")?.split(' ');
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect();
    let denied: u64 = lines
        .iter()
        .filter_map(|l| l.strip_prefix("DENIED ")?.parse::<u64>().ok())
        .sum();
    let first_sent = admitted.iter().map(|a| a.0).min().expect("some admitted");
    let last_recv = admitted.iter().map(|a| a.1).max().expect("some admitted");
    let elapsed = (last_recv - first_sent) as f64 / 1e6;
    let bound = TRY_BURST as f64 + TRY_RATE as f64 * elapsed + 1.0;
    eprintln!(
        "{} processes: {} admitted, {denied} denied in {elapsed:.3} s; bound {bound:.1}",
        PROCESSES,
        admitted.len()
    );
    assert!(
        denied > admitted.len() as u64,
        "the load must exceed the quota for the check to mean anything"
    );
    assert!(
        admitted.len() as f64 <= bound,
        "admitted {} > burst + rate × elapsed + 1 = {bound:.1}",
        admitted.len()
    );
    // A limit multiplied per process would admit about PROCESSES × as much.
    assert!(admitted.len() as f64 > 0.5 * (TRY_BURST as f64 + TRY_RATE as f64 * elapsed));
}

#[test]
fn book_across_processes_books_a_schedule_a_strict_server_fully_accepts() {
    if as_worker() {
        return;
    }
    let server = RedisServer::start();
    let lines = run_workers(
        "book_across_processes_books_a_schedule_a_strict_server_fully_accepts",
        "book",
        &server.url(),
    );
    let mut booked: Vec<u64> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("BOOKED ")?.parse().ok())
        .collect();
    booked.sort_unstable();
    let start = booked[0];
    let relative: Vec<u64> = booked.iter().map(|t| t - start).collect();
    let tally = StrictServer::new(BOOK_BURST, BOOK_RATE, 1_000_000).replay(&relative);
    eprintln!(
        "{} processes booked {} sends over {:.3} s: {tally:?}",
        PROCESSES,
        booked.len(),
        *relative.last().unwrap() as f64 / 1e6
    );
    assert!(
        booked.len() as u64 > BOOK_BURST + BOOK_RATE / 2,
        "enough bookings to drain the burst and run at the rate"
    );
    assert_eq!(tally.rejected, 0, "zero 429s on the combined schedule");
    assert_eq!(tally.ok as usize, booked.len());
}
