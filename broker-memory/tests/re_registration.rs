//! What a re-registration of a resource keeps: the slots held (also when
//! the rate limits change in number), no more tokens than the new burst,
//! the holds set after a 429 for the calls booked before it, and the count
//! of the permits held on it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::{
    Acquisition, Cost, Limits, ManualClock, Outcome, RateLimit, ResourceBroker, ResourceConfig,
    Store, TokioClock,
};
use broker_memory::MemoryBackend;
use tokio::time::Instant;

fn broker(clock: &ManualClock) -> ResourceBroker {
    let backend: Arc<dyn Store> = Arc::new(MemoryBackend::with_clock(clock.clone()));
    ResourceBroker::from_arc(backend)
}

fn take(broker: &ResourceBroker, resource: &str) -> Acquisition {
    broker
        .try_acquire_now(resource, Cost::default())
        .expect("in-memory answers at once")
        .unwrap()
}

/// Another number of rate limits starts the buckets afresh, but a slot
/// held before stays held: the concurrency limit still counts it.
#[test]
fn a_new_number_of_rate_limits_keeps_the_slots_held() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    let one = Limits::new()
        .rate(RateLimit::per_second(100))
        .max_concurrent(1);
    broker.register_limit("api", one).unwrap();
    let mut first = take(&broker, "api");
    assert!(first.allowed && first.permit.is_held());
    let two = Limits::new()
        .rate(RateLimit::per_second(100))
        .rate(RateLimit::per_minute(1000))
        .max_concurrent(1);
    broker.register_limit("api", two).unwrap();
    let second = take(&broker, "api");
    assert!(!second.allowed, "one slot, held by the first permit");
    first.permit.release();
    assert!(take(&broker, "api").allowed, "released, the slot is free");
    // Back to one rate limit, with no slot held: a state of its own again.
    broker
        .register_limit("api", Limits::new().rate(RateLimit::per_second(1)))
        .unwrap();
    assert!(take(&broker, "api").allowed);
    assert!(!take(&broker, "api").allowed);
}

/// 100 a second and `n` concurrent.
fn slots(n: u32) -> Limits {
    Limits::new()
        .rate(RateLimit::per_second(100))
        .max_concurrent(n)
}

/// `stats().in_flight` counts the permits held on the registrations a
/// re-registration replaced, until they are released; the other counters
/// start at the latest registration.
#[test]
fn in_flight_counts_the_permits_held_across_re_registrations() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    let in_flight = |b: &ResourceBroker| b.stats().resources["api"].in_flight;
    broker.register_limit("api", slots(3)).unwrap();
    let mut first = take(&broker, "api");
    broker.register_limit("api", slots(4)).unwrap();
    let mut second = take(&broker, "api");
    broker.register_limit("api", slots(5)).unwrap();
    assert_eq!(
        in_flight(&broker),
        2,
        "one permit on each replaced registration"
    );
    assert_eq!(
        broker.stats().resources["api"].allowed,
        0,
        "counted from the latest"
    );
    let mut third = take(&broker, "api");
    assert_eq!(in_flight(&broker), 3);
    first.permit.release();
    assert_eq!(in_flight(&broker), 2);
    second.permit.release();
    assert_eq!(in_flight(&broker), 1);
    third.permit.release();
    assert_eq!(in_flight(&broker), 0);
}

/// A long chain of re-registrations, kept alive by a permit on the first
/// (a thread's kept registry can hold an old one the same way), is freed
/// without running out of stack.
#[test]
fn a_long_chain_of_re_registrations_drops_without_overflow() {
    let run = || {
        let clock = ManualClock::new();
        let broker = broker(&clock);
        broker.register_limit("api", slots(3)).unwrap();
        let mut first = take(&broker, "api");
        for i in 0..100_000u32 {
            broker.register_limit("api", slots(3 + i % 2)).unwrap();
        }
        assert_eq!(broker.stats().resources["api"].in_flight, 1);
        first.permit.release();
        drop(first);
        drop(broker);
    };
    // A small stack, as a worker thread's may be.
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(run)
        .unwrap()
        .join()
        .expect("no overflow");
}

/// A smaller burst applies at once, also at the instant of the last
/// decision (no time passed to refill and cap the bucket).
#[test]
fn a_smaller_burst_caps_the_tokens_kept() {
    let clock = ManualClock::new();
    let broker = broker(&clock);
    broker
        .register_limit("api", Limits::new().rate(RateLimit::per_second(10)))
        .unwrap();
    assert!(take(&broker, "api").allowed, "9 tokens left at t = 0");
    broker
        .register_limit("api", Limits::new().rate(RateLimit::per_second(1)))
        .unwrap();
    let admitted = (0..9).filter(|_| take(&broker, "api").allowed).count();
    assert_eq!(admitted, 1, "burst 1");
    clock.advance(Duration::from_secs(1));
    assert!(take(&broker, "api").allowed, "one token a second");
    assert!(!take(&broker, "api").allowed);
}

/// A penalty set through the current registration holds the calls that
/// were booked through the one before (a config reload in between).
#[tokio::test(start_paused = true)]
async fn a_penalty_holds_calls_booked_before_a_re_registration() {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    let limits = || Limits::new().rate(RateLimit::per_second(1));
    broker
        .register("api", ResourceConfig::new(limits()))
        .unwrap();
    let t0 = Instant::now();
    let sent: Arc<Mutex<Vec<u128>>> = Arc::default();
    let mut running = Vec::new();
    for _ in 0..3 {
        let (broker, sent) = (broker.clone(), sent.clone());
        running.push(tokio::spawn(async move {
            broker
                .enqueue("api", Cost::default(), |_| {
                    let sent = sent.clone();
                    async move {
                        sent.lock().unwrap().push(t0.elapsed().as_millis());
                        Outcome::<(), ()>::ok(())
                    }
                })
                .await
        }));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker
        .register("api", ResourceConfig::new(limits()))
        .unwrap();
    broker
        .penalize("api", Duration::from_secs(10))
        .await
        .unwrap();
    for job in running {
        job.await.unwrap().unwrap();
    }
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent[0], 0);
    assert!(
        sent[1..].iter().all(|&t| t >= 10_500),
        "a call went out inside the 10 s penalty set at 0.5 s: {sent:?}"
    );
}
