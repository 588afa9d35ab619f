//! Mapping a published quota to `Limits`, measured in virtual time against
//! models of the upstreams that publish them: nginx `limit_req ... nodelay`
//! and fixed windows of N per window. The README's table of mappings
//! quotes these figures (`cargo test --test published_quota -- --nocapture`).

use std::sync::{Arc, Mutex};

use resource_broker::{
    Cost, Limits, MemoryBackend, Outcome, RateLimit, ResourceBroker, ResourceConfig, TokioClock,
};
use tokio::time::Instant;

/// An upstream's admission rule, fed receive times in µs (not decreasing).
trait Upstream: Send + 'static {
    fn receive(&mut self, at_us: u64) -> bool;
}

/// nginx `limit_req zone=... rate=Rr/s burst=B nodelay`, as its module
/// computes it: an excess in thousandths of a request, per millisecond.
struct Nginx {
    rate: i64,
    burst: i64,
    excess: i64,
    last_ms: Option<i64>,
}

impl Nginx {
    fn new(per_second: i64, burst: i64) -> Self {
        Self {
            rate: per_second * 1000,
            burst: burst * 1000,
            excess: 0,
            last_ms: None,
        }
    }
}

impl Upstream for Nginx {
    fn receive(&mut self, at_us: u64) -> bool {
        let now = (at_us / 1000) as i64;
        let Some(last) = self.last_ms else {
            // A new node admits its first request with an excess of 0.
            self.last_ms = Some(now);
            return true;
        };
        let excess = (self.excess - self.rate * (now - last) / 1000 + 1000).max(0);
        if excess > self.burst {
            return false;
        }
        self.excess = excess;
        self.last_ms = Some(now);
        true
    }
}

/// At most `limit` requests in each fixed window of `window_us`, counted
/// from time 0.
struct FixedWindow {
    limit: u64,
    window_us: u64,
    window: u64,
    count: u64,
}

impl Upstream for FixedWindow {
    fn receive(&mut self, at_us: u64) -> bool {
        let window = at_us / self.window_us;
        if window != self.window {
            (self.window, self.count) = (window, 0);
        }
        self.count += 1;
        self.count <= self.limit
    }
}

/// What one run saw: the upstream's answers and the last send (µs).
#[derive(Debug)]
struct Run {
    accepted: u64,
    rejected: u64,
    last_send_us: u64,
}

/// `jobs` calls enqueued at once on a resource of `config`, sent to `upstream`.
async fn run(config: ResourceConfig, jobs: u64, upstream: impl Upstream) -> Run {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    broker.register("upstream", config).unwrap();
    let upstream = Arc::new(Mutex::new(upstream));
    let start = Instant::now();
    let calls: Vec<_> = (0..jobs)
        .map(|_| {
            let (broker, upstream) = (broker.clone(), upstream.clone());
            tokio::spawn(async move {
                broker
                    .enqueue("upstream", Cost::default(), |_| {
                        let at = start.elapsed().as_micros() as u64;
                        let ok = upstream.lock().unwrap().receive(at);
                        async move { Outcome::<(u64, bool), ()>::ok((at, ok)) }
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut r = Run {
        accepted: 0,
        rejected: 0,
        last_send_us: 0,
    };
    for call in calls {
        let (at, ok) = call.await.unwrap();
        r.last_send_us = r.last_send_us.max(at);
        if ok {
            r.accepted += 1;
        } else {
            r.rejected += 1;
        }
    }
    r
}

const R: u64 = 10;
const B: u64 = 5;

/// Accepted requests as a share of what nginx admits over the same span:
/// `B + 1` at once, then `R` a second.
fn nginx_utilization(r: &Run) -> f64 {
    let admissible = (B + 1) as f64 + R as f64 * r.last_send_us as f64 / 1e6;
    r.accepted as f64 / admissible
}

fn nginx() -> Nginx {
    Nginx::new(R as i64, B as i64)
}

#[tokio::test(start_paused = true)]
async fn nginx_burst_b_nodelay_maps_to_a_burst_of_b_plus_one() {
    let published = Limits::new().rate(RateLimit::per_second(R).with_burst(B));
    let mapped = Limits::new().rate(RateLimit::per_second(R).with_burst(B + 1));
    let as_published = run(ResourceConfig::new(published), 40, nginx()).await;
    let as_mapped = run(ResourceConfig::new(mapped), 40, nginx()).await;
    let (u_published, u_mapped) = (
        nginx_utilization(&as_published),
        nginx_utilization(&as_mapped),
    );
    println!("nginx rate={R}r/s burst={B} nodelay, 40 calls: burst {B}: {as_published:?}, utilization {u_published:.4}; burst {}: {as_mapped:?}, utilization {u_mapped:.4}", B + 1);
    assert_eq!((as_published.rejected, as_mapped.rejected), (0, 0));
    // One fewer in the opening burst costs one token interval over the run.
    assert_eq!(
        as_published.last_send_us - as_mapped.last_send_us,
        1_000_000 / R
    );
    assert_eq!(u_mapped, 1.0);
    assert_eq!(u_published, 40.0 / 41.0);
}

#[tokio::test(start_paused = true)]
async fn a_five_percent_pacing_margin_costs_five_points_of_utilization() {
    let mapped = Limits::new().rate(RateLimit::per_second(R).with_burst(B + 1));
    let paced = run(
        ResourceConfig {
            pacing_margin: 0.05,
            ..ResourceConfig::new(mapped)
        },
        500,
        nginx(),
    )
    .await;
    let u = nginx_utilization(&paced);
    println!("nginx rate={R}r/s burst={B} nodelay, 500 calls, margin 0.05: {paced:?}, utilization {u:.4}");
    assert_eq!(paced.rejected, 0);
    assert!((0.945..=0.955).contains(&u), "utilization {u}");
}

#[tokio::test(start_paused = true)]
async fn n_per_window_in_fixed_windows_needs_a_burst_of_one() {
    let window = || FixedWindow {
        limit: 10,
        window_us: 1_000_000,
        window: 0,
        count: 0,
    };
    let bucket = run(
        ResourceConfig::new(Limits::new().rate(RateLimit::per_second(10))),
        30,
        window(),
    )
    .await;
    let spaced = run(
        ResourceConfig::new(Limits::new().rate(RateLimit::per_second(10).with_burst(1))),
        30,
        window(),
    )
    .await;
    println!("10 per fixed second, 30 calls: burst 10: {bucket:?}; burst 1: {spaced:?}");
    // A full bucket at a window's start and its refill within the window
    // send nearly twice the window's count.
    assert!(bucket.rejected > 0);
    assert_eq!((spaced.accepted, spaced.rejected), (30, 0));
    // Spaced evenly, 30 calls take 29 intervals of 100 ms.
    assert_eq!(spaced.last_send_us, 2_900_000);
}

#[test]
fn the_nginx_model_admits_b_plus_one_at_once_then_r_a_second() {
    let mut n = nginx();
    let opening = (0..10).filter(|_| n.receive(0)).count();
    assert_eq!(opening, (B + 1) as usize);
    assert!(!n.receive(99_000));
    assert!(n.receive(100_000));
    assert!(!n.receive(100_000));
}
