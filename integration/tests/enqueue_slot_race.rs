//! A call waiting for the slot of a call that gets an upstream 429, with
//! the two on different threads: the waiter must not go out before the
//! 429's penalty is on. Its own test binary: it installs the process's
//! `metrics` recorder, the one place the 429's handling can be stopped
//! between freeing the slot and putting the penalty on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use broker_core::{Cost, Limits, Outcome, RateLimit, ResourceBroker, ResourceConfig, TokioClock};
use broker_memory::MemoryBackend;
use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder};
use metrics::{SharedString, Unit};

/// Set once the waiting call's work starts.
static SECOND_WENT: AtomicBool = AtomicBool::new(false);
/// Whether the waiting call went out while the 429 was being handled.
static WENT_DURING_429: OnceLock<bool> = OnceLock::new();

/// Holds the thread that counts an upstream 429 until the waiting call
/// goes out, or for half a second: before the penalty was put on ahead of the
/// slot's release, the waiter took the freed slot meanwhile and went out.
struct Stall;

impl CounterFn for Stall {
    fn increment(&self, _: u64) {
        let start = std::time::Instant::now();
        while !SECOND_WENT.load(Ordering::SeqCst) && start.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = WENT_DURING_429.set(SECOND_WENT.load(Ordering::SeqCst));
    }
    fn absolute(&self, _: u64) {}
}

struct StallOn429;

impl Recorder for StallOn429 {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match key.name() {
            "resource_broker_upstream_429_total" => Counter::from_arc(Arc::new(Stall)),
            _ => Counter::noop(),
        }
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// The call holding the only slot gets a 429 on one runtime's thread; the
/// call waiting for that slot runs on another's. The waiter must wait the
/// 429's penalty out, not take the slot the 429'd call frees before its penalty
/// is on (before, it went out at once: the penalty was put on after the slot
/// was released, and checked by the waiter once it had the slot).
#[test]
fn a_call_waiting_on_another_thread_waits_out_a_429_of_the_call_holding_it() {
    metrics::set_global_recorder(StallOn429).expect("one recorder per test binary");
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    let limits = Limits::new()
        .rate(RateLimit::per_second(100))
        .max_concurrent(1);
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let started_tx = Mutex::new(Some(started_tx));
    let first = {
        let broker = broker.clone();
        std::thread::spawn(move || {
            runtime().block_on(broker.enqueue("api", Cost::default(), |attempt| {
                if let Some(tx) = started_tx.lock().unwrap().take() {
                    tx.send(()).unwrap();
                }
                async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    match attempt.number {
                        1 => Outcome::rate_limited("429", Some(Duration::from_secs(1))),
                        _ => Outcome::<(), &str>::ok(()),
                    }
                }
            }))
        })
    };
    started_rx.recv().unwrap();
    let second = std::thread::spawn(move || {
        runtime().block_on(broker.enqueue("api", Cost::default(), |_| async {
            SECOND_WENT.store(true, Ordering::SeqCst);
            Outcome::<(), &str>::ok(())
        }))
    });
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    assert_eq!(
        WENT_DURING_429.get(),
        Some(&false),
        "the waiting call went out before the 429's penalty was on"
    );
}
