//! The seed scenario of DESIGN.md: capacity 3, refill 2 tokens/s, workers A
//! and B with four jobs each at t=0, against a strict server with the same
//! quota. Each function drives a backend in virtual time and returns what
//! it saw; the callers assert.

use std::time::Duration;

use broker_core::{Cost, LimitSpec, Limits, ManualClock, Micros, RateLimit, Store};
use broker_testkit::{StrictServer, Tally};

/// The seed quota: burst 3, 2 tokens per second.
pub fn seed_limits() -> Limits {
    Limits::new().rate(RateLimit::per(2, Duration::from_secs(1)).with_burst(3))
}

/// The seed quota compiled for the backend.
pub fn seed_spec() -> LimitSpec {
    LimitSpec::new(&seed_limits(), Duration::from_secs(60))
}

/// The upstream of the seed: the same quota, enforced strictly on receive.
pub fn seed_server() -> StrictServer {
    StrictServer::new(3, 2, 1_000_000)
}

/// Send times (µs after now) of the eight jobs when A and B book in
/// turn A,B,A,B,... on one shared bucket.
pub async fn shared_bucket_send_times(backend: &dyn Store, key: &str) -> Vec<Micros> {
    let spec = seed_spec();
    let mut sends = Vec::new();
    for _job in 0..4 {
        for _worker in ["A", "B"] {
            let r = backend
                .book(key, &spec, Cost::default(), Duration::from_secs(3600))
                .await
                .expect("book");
            assert!(r.booked);
            sends.push(r.wait);
        }
    }
    sends
}

/// Send times when each worker has its own full bucket (`{key}:A`,
/// `{key}:B`), booking its four jobs at t = 0.
pub async fn separate_buckets_send_times(backend: &dyn Store, key: &str) -> Vec<Micros> {
    let spec = seed_spec();
    let mut sends = Vec::new();
    for worker in ["A", "B"] {
        let worker_key = format!("{key}:{worker}");
        for _job in 0..4 {
            let r = backend
                .book(
                    &worker_key,
                    &spec,
                    Cost::default(),
                    Duration::from_secs(3600),
                )
                .await
                .expect("book");
            sends.push(r.wait);
        }
    }
    sends
}

/// Replays send times against the strict server.
pub fn replay(sends: &[Micros]) -> Tally {
    seed_server().replay(sends)
}

/// After the shared schedule, penalize at 2.5 s for 1.5 s, then book at
/// 2.6 s and 2.7 s; returns the absolute times (µs) the two bookings get.
pub async fn penalty_then_two_bookings(
    backend: &dyn Store,
    clock: &ManualClock,
    key: &str,
) -> [Micros; 2] {
    let spec = seed_spec();
    clock.set(2_500_000);
    backend
        .penalize(key, &spec, Duration::from_millis(1500))
        .await
        .expect("penalize");
    let mut got = [0; 2];
    for (i, at) in [2_600_000, 2_700_000].into_iter().enumerate() {
        clock.set(at);
        let r = backend
            .book(key, &spec, Cost::default(), Duration::from_secs(3600))
            .await
            .expect("book");
        got[i] = at + r.wait;
    }
    got
}
