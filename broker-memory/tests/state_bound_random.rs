//! Random keyed calls (try, book with bookings ahead, penalties,
//! reconciles, slots held and released; sub-keys, opaque keys and own
//! states) on a store bounded at 64 states: each key is allowed no more
//! than its burst plus what refills in the time run.

use broker_testkit::Lcg;
use std::collections::HashMap;
use std::time::Duration;

use broker_core::{
    Cost, LimitSpec, Limits, ManualClock, Observed, ObservedLimit, RateLimit, Store,
};
use broker_memory::MemoryBackend;

#[tokio::test]
async fn random_calls_never_pass_a_keys_limit() {
    for seed in 0..6u64 {
        let mut rng = Lcg(seed);
        let clock = ManualClock::new();
        clock.set(1_000_000_000);
        let backend = MemoryBackend::with_clock(clock.clone()).max_states(64);
        let one = LimitSpec::new(
            &Limits::new().rate(RateLimit::per_minute(5)),
            Duration::from_secs(60),
        );
        let two = LimitSpec::new(
            &Limits::new()
                .rate(RateLimit::per_minute(5))
                .rate(RateLimit::per(50, Duration::from_secs(3600)))
                .max_concurrent(2),
            Duration::from_secs(60),
        );
        let mut allowed: HashMap<String, u64> = HashMap::new();
        let mut leases: Vec<(String, u64)> = Vec::new();
        let start = 1_000_000_000u64;
        for _ in 0..30_000 {
            let k = rng.next(300);
            let (key, spec) = match rng.next(4) {
                0 => (format!("a:k{k}"), &one),
                1 => (format!("a:k{k}:opaque"), &one),
                2 => (format!("b:k{k}"), &two),
                _ => (format!("own{}", k % 40), &one),
            };
            match rng.next(20) {
                0 if rng.next(100) == 0 => clock.advance(Duration::from_millis(rng.next(3000))),
                0 => {}
                1 => backend
                    .penalize(&key, spec, Duration::from_secs(rng.next(30)))
                    .await
                    .unwrap(),
                2 => {
                    let obs = ObservedLimit {
                        requests: Some(Observed {
                            limit: None,
                            remaining: Some(rng.next(3)),
                            reset: Some(Duration::from_secs(rng.next(20))),
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    backend.reconcile(&key, spec, &obs).await.unwrap()
                }
                4 | 5 => {
                    let wait = Duration::from_secs(rng.next(30));
                    let r = backend
                        .book(&key, spec, Cost::default(), wait)
                        .await
                        .unwrap();
                    if r.booked {
                        *allowed.entry(key.clone()).or_default() += 1;
                    }
                }
                3 => {
                    if let Some((k, l)) = leases.pop() {
                        backend.release(&k, l).await.unwrap();
                    }
                }
                _ => {
                    let d = backend
                        .try_acquire(&key, spec, Cost::default())
                        .await
                        .unwrap();
                    if d.allowed {
                        *allowed.entry(key.clone()).or_default() += 1;
                        if let Some(l) = d.lease {
                            if rng.next(3) == 0 {
                                backend.release(&key, l).await.unwrap();
                            } else {
                                leases.push((key, l));
                            }
                        }
                    }
                }
            }
        }
        let elapsed = (broker_core::Clock::now(&clock) - start) as f64;
        let most = 5.0 + (elapsed + 30e6) * 5.0 / 60_000_000.0;
        assert!(backend.folded() > 1_000, "{}", backend.folded());
        for (key, n) in &allowed {
            assert!(
                (*n as f64) <= most.floor(),
                "seed {seed}: {key} allowed {n}, at most {most}"
            );
        }
    }
}
