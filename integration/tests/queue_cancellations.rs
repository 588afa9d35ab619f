//! Issue 41, the line moves up: callers who give up leave the queue at no
//! cost, so the calls behind them use the time. 800 callers arrive at
//! twice the rate and half of them give up at random times: a strict
//! upstream model answers no 429, at least 95% of the quota is used while
//! callers wait, and nothing stays booked, queued or held. Memory store,
//! tokio's paused time.

use broker_testkit::Lcg;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::{Cost, Limits, Outcome, RateLimit, ResourceBroker, ResourceConfig, TokioClock};
use broker_memory::MemoryBackend;
use broker_testkit::{StrictServer, Tally};
use tokio::time::Instant;

const CALLERS: u64 = 800;
/// The quota: 10 a second, one at once.
const RATE: u64 = 10;
/// Callers arrive at twice the rate: one every 50 ms, for 40 s.
const ARRIVAL_GAP_MS: u64 = 1000 / (2 * RATE);

/// The send times (µs from the start) of the calls that went out, with
/// `max_concurrent` slots and work of `work_ms`.
async fn storm(brokers: &[ResourceBroker], seed: u64, work_ms: u64) -> Vec<u64> {
    let t0 = Instant::now();
    let sends: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut rng = Lcg(seed);
    let mut callers = Vec::new();
    for i in 0..CALLERS {
        let arrive = Duration::from_millis(i * ARRIVAL_GAP_MS);
        // Half give up, after 0 to 20 s (some while queued, some as head,
        // some booked, some holding their slot).
        let give_up = (rng.next(2) == 0).then(|| Duration::from_micros(rng.next(20_000_000)));
        let broker = brokers[i as usize % brokers.len()].clone();
        let sends = sends.clone();
        callers.push(tokio::spawn(async move {
            tokio::time::sleep_until(t0 + arrive).await;
            let call = broker.enqueue("api", Cost::default(), |_| {
                let sends = sends.clone();
                async move {
                    sends.lock().unwrap().push(t0.elapsed().as_micros() as u64);
                    tokio::time::sleep(Duration::from_millis(work_ms)).await;
                    Outcome::<(), ()>::ok(())
                }
            });
            match give_up {
                Some(after) => {
                    let _ = tokio::time::timeout(after, call).await;
                }
                None => call.await.unwrap(),
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let mut sends = sends.lock().unwrap().clone();
    sends.sort_unstable();
    sends
}

/// Sends in `[0, until]` against what the quota allows in it.
fn quota_used(sends: &[u64], until: u64) -> f64 {
    let n = sends.iter().filter(|&&t| t <= until).count() as f64;
    let possible = 1.0 + (RATE * until) as f64 / 1e6;
    n / possible
}

fn config(max_concurrent: Option<u32>) -> ResourceConfig {
    let mut limits = Limits::new().rate(RateLimit::per_second(RATE).with_burst(1));
    if let Some(n) = max_concurrent {
        limits = limits.max_concurrent(n);
    }
    ResourceConfig {
        queue_capacity: CALLERS as usize,
        ..ResourceConfig::new(limits)
    }
}

/// The storm on `brokers` (one store): no 429, the quota used, nothing
/// left booked, queued or held.
async fn a_storm_of_cancellations_wastes_no_quota(
    brokers: &[ResourceBroker],
    max_concurrent: Option<u32>,
    work_ms: u64,
) {
    let sends = storm(brokers, 7, work_ms).await;
    let tally = StrictServer::new(1, RATE, 1_000_000).replay(&sends);
    let all = Tally {
        ok: sends.len() as u32,
        rejected: 0,
    };
    assert_eq!(tally, all, "no 429 from the strict upstream");
    // Callers wait all along the arrivals (40 s): the quota is used.
    let arrivals_end = CALLERS * ARRIVAL_GAP_MS * 1000;
    let used = quota_used(&sends, arrivals_end);
    println!(
        "{} broker(s), max_concurrent {max_concurrent:?}: {} sends, {:.1}% of the quota used in the first {} s",
        brokers.len(),
        sends.len(),
        used * 100.0,
        arrivals_end / 1_000_000
    );
    assert!(used >= 0.95, "{:.1}% of the quota used", used * 100.0);
    // Nothing left booked, queued or held.
    for broker in brokers {
        let stats = &broker.stats().resources["api"];
        assert_eq!((stats.queued, stats.in_flight), (0, 0));
        assert!(stats.queue.levels.iter().all(|l| l.depth == 0));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        broker_testkit::allowed_in_a_row(&brokers[0], "api").await,
        1
    );
}

fn memory_broker(max_concurrent: Option<u32>) -> ResourceBroker {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    broker.register("api", config(max_concurrent)).unwrap();
    broker
}

#[tokio::test(start_paused = true)]
async fn callers_giving_up_at_random_leave_their_time_to_the_next() {
    a_storm_of_cancellations_wastes_no_quota(&[memory_broker(None)], None, 0).await;
}

#[tokio::test(start_paused = true)]
async fn callers_giving_up_while_holding_a_slot_leave_nothing_held() {
    a_storm_of_cancellations_wastes_no_quota(&[memory_broker(Some(2))], Some(2), 150).await;
}

/// On a real redis-server, two brokers, callers giving up at random while
/// queued, as head, booked or holding a slot: once they are gone nothing
/// is queued, nothing in flight, and both slots are free in the store.
/// (Real time: only what is left behind is asserted, no timing.)
#[tokio::test]
async fn callers_giving_up_on_redis_leave_no_slot_held_and_no_queue() {
    let server = broker_testkit::RedisServer::start();
    let mut brokers = Vec::new();
    for _ in 0..2 {
        let backend = broker_redis::RedisBackend::connect(&server.url())
            .await
            .unwrap();
        let broker = ResourceBroker::new(backend);
        let limits = Limits::new()
            .rate(RateLimit::per_second(20).with_burst(1))
            .max_concurrent(2);
        broker.register("api", ResourceConfig::new(limits)).unwrap();
        brokers.push(broker);
    }
    let mut rng = Lcg(11);
    let mut callers = Vec::new();
    for i in 0..60u64 {
        let broker = brokers[i as usize % 2].clone();
        let give_up = (rng.next(2) == 0).then(|| Duration::from_millis(rng.next(1500)));
        callers.push(tokio::spawn(async move {
            let call = broker.enqueue("api", Cost::default(), |_| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Outcome::<(), ()>::ok(())
            });
            match give_up {
                Some(after) => {
                    let _ = tokio::time::timeout(after, call).await;
                }
                None => call.await.unwrap(),
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    for broker in &brokers {
        let stats = &broker.stats().resources["api"];
        assert_eq!((stats.queued, stats.in_flight), (0, 0));
        assert!(stats.queue.levels.iter().all(|l| l.depth == 0));
    }
    // Both slots are free: two permits held at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = brokers[0]
        .try_acquire("api", Cost::default())
        .await
        .unwrap();
    assert!(first.allowed, "{first:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = brokers[1]
        .try_acquire("api", Cost::default())
        .await
        .unwrap();
    assert!(second.allowed, "{second:?}");
}

/// A booking given back wakes the head of its line, which books the time
/// freed at once instead of napping until its own time came within its
/// horizon (it would then go a second later).
#[tokio::test(start_paused = true)]
async fn a_cancelled_booking_wakes_the_head_to_take_its_time() {
    use broker_core::{Priority, Target};
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    let limits = Limits::new().rate(RateLimit::per_second(1).with_burst(1));
    broker.register("api", ResourceConfig::new(limits)).unwrap();
    let t0 = Instant::now();
    let sent = |target: Target<'static>| {
        let broker = broker.clone();
        tokio::spawn(async move {
            broker
                .enqueue(target, Cost::default(), |_| async move {
                    Outcome::<Duration, ()>::ok(t0.elapsed())
                })
                .await
                .unwrap()
        })
    };
    // Goes at 0; two more book 1 s and 2 s; a batch call is head and
    // naps until its time (3 s) is within its one-second horizon.
    let first = sent(Target::from("api"));
    tokio::task::yield_now().await;
    let booked: Vec<_> = (0..2).map(|_| sent(Target::from("api"))).collect();
    tokio::task::yield_now().await;
    let head = sent(Target::from("api").priority(Priority::Batch));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The two booked calls give up, the later first: both refunded.
    for call in booked.into_iter().rev() {
        call.abort();
        tokio::task::yield_now().await;
    }
    assert_eq!(first.await.unwrap(), Duration::ZERO);
    assert_eq!(head.await.unwrap(), Duration::from_secs(1));
}

/// A settlement below the estimate gives time back and wakes the head
/// too: it goes as soon as the refunded tokens let it.
#[tokio::test(start_paused = true)]
async fn a_settlement_below_the_estimate_wakes_the_head() {
    use broker_core::{Priority, Target, Unit};
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    // One token a second, ten at most.
    let tokens = RateLimit::per(10, Duration::from_secs(10)).unit(Unit::Tokens);
    broker
        .register("llm", ResourceConfig::new(Limits::new().rate(tokens)))
        .unwrap();
    let t0 = Instant::now();
    // Estimated at ten tokens, it spends one, told after half a second.
    let big = {
        let broker = broker.clone();
        tokio::spawn(async move {
            broker
                .enqueue("llm", Cost::tokens(10), |_| async {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Outcome::<(), ()>::ok_with_usage((), Cost::tokens(1))
                })
                .await
                .unwrap()
        })
    };
    tokio::task::yield_now().await;
    let small = || {
        let broker = broker.clone();
        tokio::spawn(async move {
            let target = Target::from("llm").priority(Priority::Batch);
            broker
                .enqueue(target, Cost::tokens(1), |_| async move {
                    Outcome::<Duration, ()>::ok(t0.elapsed())
                })
                .await
                .unwrap()
        })
    };
    // The first small one books 1 s; the second is head and naps.
    let booked = small();
    tokio::task::yield_now().await;
    let head = small();
    big.await.unwrap();
    assert_eq!(booked.await.unwrap(), Duration::from_secs(1));
    assert_eq!(head.await.unwrap(), Duration::from_millis(500));
}
