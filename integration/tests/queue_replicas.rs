//! Issues 41 and 42 across replicas: the wait queue's goals with two OS
//! processes on one real redis-server. The test re-runs its own binary as
//! the workers (`RB_WORKER` names the role, as in `redis_multiprocess.rs`);
//! both start their load at one wall-clock time `RB_T0` and print what
//! happened (`SEND <µs>` per call sent, waits, errors); the test checks the
//! combined result.
//!
//! Real time (Redis keeps real time; the redis-server on loopback shares
//! the host's clock): each goal is scaled to a quota of 10 a second, one
//! at once (a token interval of 100 ms), so that it runs in seconds; each
//! test's doc says what was scaled. Run with `--nocapture` to see the
//! figures.
//!
//! The strict upstream model is fed the times the work started, which lag
//! their booked times by the Redis round trips and the timer's wake-up,
//! and by a scheduling stall of a loaded machine. It holds one request
//! more than the bucket (capacity 2 for a burst of 1): that absorbs a send
//! late by up to one token interval and nothing more; while the queue
//! keeps the resource saturated the spare token never refills, so two
//! sends closer than the quota allows anywhere in a busy stretch answer
//! 429.
//!
//! A loaded machine keeps a worker off the CPU now and then, and its sends
//! go out late by that much whatever the queue does. Each worker measures
//! it (`STALL <µs>` per delay of a sleep and `PING` on its runtime, see
//! `Stalls`) and the bounds that stand for real time widen by what a stall
//! longer than a token interval explains, no more: on a machine that kept
//! the workers and the server running they are the bounds above.

mod workers;

use broker_testkit::Lcg;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broker_core::clock::micros;
use broker_core::{
    Cost, Limits, Outcome, Priority, RateLimit, ResourceBroker, ResourceConfig, RetryPolicy, Target,
};
use broker_redis::RedisBackend;
use broker_testkit::{RedisServer, StrictServer, Tally};
use workers::{run_workers, wall_us};

/// The quota of the tests: 10 a second, one at once.
const RATE: u64 = 10;
const INTERVAL: Duration = Duration::from_millis(1000 / RATE);

/// The tests of this file run one at a time: their timings are real, and
/// four pairs of workers on two cores would stall each other's sends.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The numbers of the lines `<tag> <n>` of `lines`.
fn numbers(lines: &[String], tag: &str) -> Vec<u64> {
    let prefix = format!("{tag} ");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .collect()
}

/// The sends of every worker, µs from `t0`, sorted.
fn sends(t0: u64, outputs: &[Vec<String>]) -> Vec<u64> {
    let mut all: Vec<u64> = outputs
        .iter()
        .flat_map(|lines| numbers(lines, "SEND"))
        .map(|t| t.saturating_sub(t0))
        .collect();
    all.sort_unstable();
    all
}

/// The strict model's answers to `sends` (see the module's doc). A worker
/// kept off the CPU for `stall` sends late by that much: past one token
/// interval, the model holds one more request per interval of it.
fn strict_replay(sends: &[u64], stall: u64) -> Tally {
    let late = stall.div_ceil(micros(INTERVAL)).saturating_sub(1);
    StrictServer::new(2 + late, RATE, 1_000_000).replay(sends)
}

/// The longest stall of the workers of `outputs` (µs).
fn longest_stall(outputs: &[Vec<String>]) -> u64 {
    let stalls = outputs.iter().flat_map(|l| numbers(l, "STALL"));
    stalls.max().unwrap_or(0)
}

/// The time a worker's stalls (its `lines`) took beyond `interval` each
/// (µs): a stall within the interval leaves its sends their times.
fn lost_to_stalls(lines: &[String], interval: Duration) -> u64 {
    let stalls = numbers(lines, "STALL").into_iter();
    stalls.map(|s| s.saturating_sub(micros(interval))).sum()
}

/// The stalls of a worker: the delays of a task on its runtime that
/// sleeps a millisecond and sends the shared server a `PING`, over and
/// over, from wall time `t0` on. A loopback `PING` takes well under a
/// millisecond; a longer round trip or sleep is time this process, or the
/// server, was kept off the CPU, and its calls' replies and sends were late.
#[derive(Default)]
struct Stalls(Mutex<Vec<u64>>);

impl Stalls {
    /// Delays under this are the timer's own.
    const NOISE: Duration = Duration::from_millis(5);

    /// Starts measuring on a task of the current runtime.
    async fn measure(url: &str, t0: u64) -> Arc<Self> {
        let client = redis::Client::open(url).expect("redis url");
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let stalls = Arc::new(Self::default());
        let measured = stalls.clone();
        tokio::spawn(async move {
            loop {
                let before = Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let _: String = redis::cmd("PING")
                    .query_async(&mut con)
                    .await
                    .expect("PING");
                // The timer's millisecond, and at most one more of its rounding.
                let late = before.elapsed().saturating_sub(Duration::from_millis(2));
                if late > Self::NOISE && wall_us() > t0 {
                    measured.0.lock().unwrap().push(micros(late));
                }
            }
        });
        stalls
    }

    /// Prints `STALL <µs>` per stall.
    fn print(&self) {
        for stall in self.0.lock().unwrap().iter() {
            println!("STALL {stall}");
        }
    }
}

fn percentile(waits: &mut [u64], per_mille: usize) -> u64 {
    waits.sort_unstable();
    let rank = (waits.len() * per_mille).div_ceil(1000).max(1);
    waits[rank - 1]
}

/// The worker's role and environment.
struct Worker {
    id: u64,
    url: String,
    t0: u64,
}

impl Worker {
    /// The tokio instant of wall time `t0 + after`.
    fn at(&self, after: Duration) -> tokio::time::Instant {
        let (now, wall) = (tokio::time::Instant::now(), wall_us());
        let at = now + after + Duration::from_micros(self.t0.saturating_sub(wall));
        at.checked_sub(Duration::from_micros(wall.saturating_sub(self.t0)))
            .unwrap_or(now)
    }

    /// A broker on the shared server with resource "api" of `config`.
    async fn broker(&self, config: ResourceConfig) -> ResourceBroker {
        let backend = RedisBackend::builder(&self.url)
            .response_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect");
        let broker = ResourceBroker::new(backend);
        broker.register("api", config).expect("register");
        broker
    }
}

/// `rate` a second, one at once.
fn limits(rate: u64) -> Limits {
    Limits::new().rate(RateLimit::per_second(rate).with_burst(1))
}

/// Spawns one `enqueue` on `target` at `at`, which prints `SEND <wall µs>`
/// when its work starts and returns (asked, sent) in wall µs, or the error.
fn spawn_call(
    broker: &ResourceBroker,
    target: Target<'static>,
    at: tokio::time::Instant,
) -> tokio::task::JoinHandle<Result<(u64, u64), String>> {
    let broker = broker.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        let asked = wall_us();
        broker
            .enqueue(target, Cost::default(), |_| async {
                let sent = wall_us();
                println!("SEND {sent}");
                Outcome::<u64, std::io::Error>::ok(sent)
            })
            .await
            .map(|sent| (asked, sent))
            .map_err(|e| e.to_string())
    })
}

/// Prints `LEFT <queued + in flight>` once the calls are gone.
fn print_left(broker: &ResourceBroker) {
    let stats = &broker.stats().resources["api"];
    let depth: u64 = stats.queue.levels.iter().map(|l| l.depth).sum();
    println!("LEFT {}", stats.queued + stats.in_flight + depth);
}

fn worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// In a worker process, runs its role and returns true.
fn as_worker() -> bool {
    let Ok(role) = std::env::var("RB_WORKER") else {
        return false;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name}"));
    let worker = Worker {
        id: var("RB_WORKER_ID").parse().expect("RB_WORKER_ID"),
        url: var("RB_URL"),
        t0: var("RB_T0").parse().expect("RB_T0"),
    };
    // Ends the harness's `test NAME ... ` line: the worker's lines start
    // on lines of their own.
    println!();
    worker_runtime().block_on(async {
        let stalls = Stalls::measure(&worker.url, worker.t0).await;
        match role.as_str() {
            "cancel" => cancel_worker(&worker).await,
            "batch" => batch_worker(&worker).await,
            "interactive" => interactive_worker(&worker).await,
            "tenant-a" => tenant_a_worker(&worker).await,
            "tenant-b" => tenant_b_worker(&worker).await,
            "deep" => deep_worker(&worker).await,
            other => panic!("unknown worker role {other}"),
        }
        stalls.print();
    });
    true
}

// 1. Cancellations.

/// Callers per process: each process's arrive at the rate, so together
/// twice the rate, for 10 s.
const CANCEL_CALLERS: u64 = 100;
/// Half the callers give up after 0 to this long: 100 token intervals,
/// half as long as in the test on memory, so that it tells the queue
/// from bookings made on arrival (see the test's doc).
const GIVE_UP_WITHIN: u64 = 10_000_000;

/// Worker: `CANCEL_CALLERS` callers, one every token interval (the other
/// process's half an interval later), half giving up at random; prints
/// `SEND`, `ERR` per patient call that failed, and `LEFT`.
async fn cancel_worker(w: &Worker) {
    let config = ResourceConfig {
        queue_capacity: 10_000,
        ..ResourceConfig::new(limits(RATE))
    };
    let broker = w.broker(config).await;
    let mut rng = Lcg(7 + w.id);
    let offset = INTERVAL / 2 * w.id as u32;
    let mut callers = Vec::new();
    for k in 0..CANCEL_CALLERS {
        let arrive = w.at(INTERVAL * k as u32 + offset);
        let call = spawn_call(&broker, "api".into(), arrive);
        let give_up = (rng.next(2) == 0).then(|| Duration::from_micros(rng.next(GIVE_UP_WITHIN)));
        callers.push(tokio::spawn(async move {
            match give_up {
                Some(after) => abort_after(call, arrive + after).await,
                None => call.await.expect("caller").err(),
            }
        }));
    }
    for c in callers {
        if let Some(e) = c.await.expect("caller") {
            println!("ERR {e}");
        }
    }
    print_left(&broker);
}

/// Gives a call up at `at` unless it ended before: its error, if it
/// ended in one.
async fn abort_after<T>(
    mut call: tokio::task::JoinHandle<Result<T, String>>,
    at: tokio::time::Instant,
) -> Option<String> {
    match tokio::time::timeout_at(at, &mut call).await {
        Ok(done) => done.expect("caller").err(),
        Err(_) => {
            call.abort();
            let _ = call.await;
            None
        }
    }
}

/// Issue 41's cancellation goal across two processes: callers arrive at
/// twice the rate (each process at the rate), half give up at random
/// times; the combined sends get no 429 from the strict model, at least
/// 95% of the quota is used while callers arrive, every patient caller is
/// served, and nothing stays queued or in flight. Scaled: 200 callers
/// over 10 s (800 over 40 s in the test on memory), giving up within
/// 10 s (100 token intervals; 200 on memory): with bookings made on
/// arrival, as before the queue, 84-85% of the quota was used (95% with
/// 200 intervals, which told the two apart no more).
#[test]
fn callers_of_two_processes_giving_up_at_random_leave_their_time_to_the_next() {
    if as_worker() {
        return;
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = RedisServer::start();
    let test = "callers_of_two_processes_giving_up_at_random_leave_their_time_to_the_next";
    let (t0, outputs) = run_workers(test, &["cancel", "cancel"], &server.url());
    let sends = sends(t0, &outputs);
    let tally = strict_replay(&sends, longest_stall(&outputs));
    let arrivals = CANCEL_CALLERS * INTERVAL.as_micros() as u64;
    // The send of the last time in the window goes out a little after it.
    let lateness = micros(INTERVAL / 2);
    let in_arrivals = sends.iter().filter(|&&t| t <= arrivals + lateness).count();
    let possible = 1.0 + (RATE * arrivals) as f64 / 1e6;
    let used = in_arrivals as f64 / possible;
    let strict_burst = StrictServer::new(1, RATE, 1_000_000).replay(&sends);
    let errors: Vec<&String> = outputs
        .iter()
        .flatten()
        .filter(|l| l.starts_with("ERR"))
        .collect();
    eprintln!(
        "cancellations, 2 processes: {} sends, {:.1}% of the quota used in the first {} s; \
         strict model {tally:?} (at capacity 1: {strict_burst:?}); errors {errors:?}",
        sends.len(),
        used * 100.0,
        arrivals / 1_000_000
    );
    assert_eq!(tally.rejected, 0, "no 429 from the strict upstream");
    assert!(used >= 0.95, "{:.1}% of the quota used", used * 100.0);
    assert!(errors.is_empty(), "every patient caller served: {errors:?}");
    for lines in &outputs {
        assert_eq!(
            numbers(lines, "LEFT"),
            [0],
            "nothing left queued or in flight"
        );
    }
}

// 2. Priority.

/// The quota of the priority test: 20 a second, one at once (see
/// [`interactive_calls_of_one_process_overtake_a_batch_of_another`]).
const PRIORITY_RATE: u64 = 20;
const PRIORITY_INTERVAL: Duration = Duration::from_millis(1000 / PRIORITY_RATE);
/// The batch: 20 s deep, enough to keep the resource saturated for the run.
const BATCH: u64 = 400;
/// How long the batch runs; the interactive calls arrive in the first 9 s.
const PRIORITY_RUN: Duration = Duration::from_secs(10);
const INTERACTIVE_WITHIN: Duration = Duration::from_secs(9);

/// Worker: a batch of `BATCH` calls enqueued at once at `t0`, given up at
/// the end of the run; prints `SEND`.
async fn batch_worker(w: &Worker) {
    let config = ResourceConfig {
        queue_capacity: 10_000,
        ..ResourceConfig::new(limits(PRIORITY_RATE))
    };
    let broker = w.broker(config).await;
    let batch = Target::from("api").priority(Priority::Batch);
    let calls: Vec<_> = (0..BATCH)
        .map(|_| spawn_call(&broker, batch, w.at(Duration::ZERO)))
        .collect();
    for call in calls {
        abort_after(call, w.at(PRIORITY_RUN)).await;
    }
    print_left(&broker);
}

/// Worker: interactive calls at random times, 0 to 1 s apart (10 token
/// intervals of the priority test on average), for `INTERACTIVE_WITHIN`; prints `SEND` and
/// `WAIT <µs from the call to its send>`.
async fn interactive_worker(w: &Worker) {
    let config = ResourceConfig {
        queue_capacity: 10_000,
        ..ResourceConfig::new(limits(PRIORITY_RATE))
    };
    let broker = w.broker(config).await;
    let interactive = Target::from("api").priority(Priority::Interactive);
    let mut rng = Lcg(42);
    let mut after = Duration::ZERO;
    let mut calls = Vec::new();
    loop {
        after += Duration::from_millis(rng.next(1000));
        if after > INTERACTIVE_WITHIN {
            break;
        }
        calls.push(spawn_call(&broker, interactive, w.at(after)));
    }
    for call in calls {
        match call.await.expect("caller") {
            Ok((asked, sent)) => println!("WAIT {}", sent - asked),
            Err(e) => println!("ERR {e}"),
        }
    }
    print_left(&broker);
}

/// The tolerance on the interactive wait beyond two token intervals, half
/// an interval: the Redis round trips of the booking and of the penalty
/// check before the send (under a millisecond each on loopback), the
/// timer's millisecond, and the scheduling stalls of a loaded 2-core test
/// machine (up to about 20 ms seen, in both processes at once); the
/// longest stall measured in a worker is added to it.
const WAIT_TOLERANCE: Duration = Duration::from_millis(25);

/// Issue 41's priority goal across processes: process 1 runs a batch that
/// keeps the resource saturated, process 2 sends interactive calls at
/// random times; the p99 interactive wait is at most two token intervals
/// (plus `WAIT_TOLERANCE` and the longest stall of a worker), the resource
/// stays saturated while the batch's process runs (the time its stalls
/// took beyond a token interval is taken out of the run) and the batch
/// gets what the interactive calls leave. Scaled: a batch of 400 at 20/s
/// (10,000 in the issue), interactive calls 10 token intervals apart on
/// average for 9 s (21 calls: the p99 is their longest wait). Twice the
/// rate of the other tests, for as many calls as far apart (in token
/// intervals) in as long; so the strict model is not asked here: a stall
/// of one process longer than this interval shows as a 429 (the other
/// tests check the spacing of the sends of two processes).
#[test]
fn interactive_calls_of_one_process_overtake_a_batch_of_another() {
    if as_worker() {
        return;
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = RedisServer::start();
    let test = "interactive_calls_of_one_process_overtake_a_batch_of_another";
    let (t0, outputs) = run_workers(test, &["batch", "interactive"], &server.url());
    let mut waits = numbers(&outputs[1], "WAIT");
    let run = micros(PRIORITY_RUN);
    let batch_sends = sends(t0, &outputs[..1])
        .iter()
        .filter(|&&t| t <= run)
        .count();
    let sends = sends(t0, &outputs);
    let in_run = sends.iter().filter(|&&t| t <= run).count();
    let stall = longest_stall(&outputs);
    let lost = lost_to_stalls(&outputs[0], PRIORITY_INTERVAL);
    let possible = 1.0 + (PRIORITY_RATE * run.saturating_sub(lost)) as f64 / 1e6;
    let tally = StrictServer::new(2, PRIORITY_RATE, 1_000_000).replay(&sends);
    let p50 = percentile(&mut waits, 500);
    let p99 = percentile(&mut waits, 990);
    eprintln!(
        "priority, 2 processes: {} interactive calls, wait p50 {:.1} ms, p99 {:.1} ms \
         (interval {PRIORITY_INTERVAL:?}); {in_run} sends in {PRIORITY_RUN:?} ({:.1}% of the quota), \
         {batch_sends} of them batch; strict model {tally:?}; longest stall {:.1} ms, \
         {lost} µs lost by the batch",
        waits.len(),
        p50 as f64 / 1e3,
        p99 as f64 / 1e3,
        in_run as f64 / possible * 100.0,
        stall as f64 / 1e3,
    );
    assert!(
        waits.len() >= 10,
        "enough interactive calls: {}",
        waits.len()
    );
    assert!(
        Duration::from_micros(p99)
            <= 2 * PRIORITY_INTERVAL + WAIT_TOLERANCE + Duration::from_micros(stall),
        "interactive p99 {p99} µs (longest stall {stall} µs)"
    );
    assert!(
        in_run as f64 >= 0.95 * possible,
        "the resource stays saturated"
    );
    let left = possible - waits.len() as f64;
    assert!(
        batch_sends as f64 >= 0.95 * left,
        "the batch gets what the interactive calls leave: {batch_sends} of {left}"
    );
    for lines in &outputs {
        assert_eq!(
            numbers(lines, "LEFT"),
            [0],
            "nothing left queued or in flight"
        );
    }
}

// 3. Fairness.

/// Tenant A's backlog: 15 s deep.
const A_JOBS: u64 = 150;
/// When tenant B's jobs arrive, and how many.
const B_AFTER: Duration = Duration::from_secs(1);
const B_JOBS: u64 = 10;
/// How long tenant A's process runs (B's jobs take 2 s at a fair share).
const FAIRNESS_RUN: Duration = Duration::from_secs(7);

/// Worker: tenant A's backlog enqueued at once at `t0`, given up at the
/// end of the run; prints `SEND`.
async fn tenant_a_worker(w: &Worker) {
    let config = ResourceConfig {
        queue_capacity: 10_000,
        ..ResourceConfig::new(limits(RATE))
    };
    let broker = w.broker(config).await;
    let a = Target::from("api").flow("tenant-a");
    let calls: Vec<_> = (0..A_JOBS)
        .map(|_| spawn_call(&broker, a, w.at(Duration::ZERO)))
        .collect();
    for call in calls {
        abort_after(call, w.at(FAIRNESS_RUN)).await;
    }
    print_left(&broker);
}

/// Worker: tenant B's jobs, enqueued at once `B_AFTER` after `t0`; prints
/// `SEND`, `ASKED <wall µs>` and `DONE <wall µs>` per job.
async fn tenant_b_worker(w: &Worker) {
    let config = ResourceConfig {
        queue_capacity: 10_000,
        ..ResourceConfig::new(limits(RATE))
    };
    let broker = w.broker(config).await;
    let b = Target::from("api").flow("tenant-b");
    let calls: Vec<_> = (0..B_JOBS)
        .map(|_| spawn_call(&broker, b, w.at(B_AFTER)))
        .collect();
    for call in calls {
        match call.await.expect("caller") {
            Ok((asked, sent)) => println!("ASKED {asked}\nDONE {sent}"),
            Err(e) => println!("ERR {e}"),
        }
    }
    print_left(&broker);
}

/// Issue 41's fairness goal across processes: tenant A enqueues a big
/// backlog at once in process 1, tenant B 10 jobs a second later in
/// process 2; B's 10 finish within twice their fair-share time (half the
/// rate), not after A's backlog. Scaled: 10/s (100/min in the issue), A's
/// backlog 150 (10,000); B's fair share is 10 jobs in 2 s (12 s).
#[test]
fn a_small_tenant_of_one_process_does_not_wait_for_a_big_tenant_of_another() {
    if as_worker() {
        return;
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = RedisServer::start();
    let test = "a_small_tenant_of_one_process_does_not_wait_for_a_big_tenant_of_another";
    let (t0, outputs) = run_workers(test, &["tenant-a", "tenant-b"], &server.url());
    let asked = numbers(&outputs[1], "ASKED")
        .into_iter()
        .min()
        .expect("B asked");
    let done = numbers(&outputs[1], "DONE");
    let took = Duration::from_micros(done.iter().max().expect("B done") - asked);
    let fair = Duration::from_secs(B_JOBS * 2 / RATE);
    let stall = longest_stall(&outputs);
    let tally = strict_replay(&sends(t0, &outputs), stall);
    eprintln!(
        "fairness, 2 processes: tenant B's {} jobs took {took:?} (fair share {fair:?}); \
         strict model {tally:?}; longest stall {stall} µs",
        done.len()
    );
    assert_eq!(done.len() as u64, B_JOBS, "every job of B done");
    assert!(took <= 2 * fair, "B's jobs took {took:?}");
    assert_eq!(tally.rejected, 0, "no 429 from the strict upstream");
    for lines in &outputs {
        assert_eq!(
            numbers(lines, "LEFT"),
            [0],
            "nothing left queued or in flight"
        );
    }
}

// 4. Issue 42: a queue deeper than the wait ceiling.

/// Calls per process, all enqueued at once: together 5 s deep.
const DEEP_CALLS: u64 = 25;

/// Worker: `DEEP_CALLS` calls at once at `t0` under a retry policy whose
/// ceiling is 1 s; prints `SEND`, `OK <n>` and `ERR` per failed call.
async fn deep_worker(w: &Worker) {
    let retry = RetryPolicy {
        wait_ceiling: Duration::from_secs(1),
        ceiling_windows: 0,
        ceiling_margin: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let config = ResourceConfig {
        retry,
        ..ResourceConfig::new(limits(RATE))
    };
    let broker = w.broker(config).await;
    let calls: Vec<_> = (0..DEEP_CALLS)
        .map(|_| spawn_call(&broker, "api".into(), w.at(Duration::ZERO)))
        .collect();
    let mut ok = 0;
    for call in calls {
        match call.await.expect("caller") {
            Ok(_) => ok += 1,
            Err(e) => println!("ERR {e}"),
        }
    }
    println!("OK {ok}");
    print_left(&broker);
}

/// Issue 42 across processes: a batch enqueued at once by two processes,
/// its queue five times deeper than the retry policy's ceiling (1 s):
/// every call done, no error, no 429. Scaled: 50 calls at 10/s (10,000
/// at 500 RPM in the issue).
#[test]
fn a_batch_of_two_processes_deeper_than_the_wait_ceiling_completes() {
    if as_worker() {
        return;
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = RedisServer::start();
    let test = "a_batch_of_two_processes_deeper_than_the_wait_ceiling_completes";
    let (t0, outputs) = run_workers(test, &["deep", "deep"], &server.url());
    let ok: u64 = outputs.iter().flat_map(|l| numbers(l, "OK")).sum();
    let errors: Vec<&String> = outputs
        .iter()
        .flatten()
        .filter(|l| l.starts_with("ERR"))
        .collect();
    let sends = sends(t0, &outputs);
    let tally = strict_replay(&sends, longest_stall(&outputs));
    eprintln!(
        "deep queue, 2 processes: {ok} of {} done in {:.2} s, errors {errors:?}; strict model {tally:?}",
        2 * DEEP_CALLS,
        *sends.last().unwrap_or(&0) as f64 / 1e6
    );
    assert!(errors.is_empty(), "no error: {errors:?}");
    assert_eq!(ok, 2 * DEEP_CALLS);
    assert_eq!(tally.rejected, 0, "no 429 from the strict upstream");
    for lines in &outputs {
        assert_eq!(
            numbers(lines, "LEFT"),
            [0],
            "nothing left queued or in flight"
        );
    }
}
