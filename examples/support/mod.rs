//! What the seed examples share: the upstream they send to (a strict server
//! with the seed article's quota) and the table they print.

use std::time::Duration;

use resource_broker::{
    BrokerError, Cost, Limits, ManualClock, MemoryBackend, RateLimit, ResourceBroker,
};

/// The seed article's upstream quota: a burst of 3, then 2 requests a second.
pub fn seed_quota() -> Limits {
    Limits::new().rate(RateLimit::per(2, Duration::from_secs(1)).with_burst(3))
}

/// What a strict upstream with the seed quota answers to requests received
/// at `sends` (µs): `(200s, 429s)`. The upstream is itself a check + reject
/// broker, replayed on a clock set to each receive time.
pub async fn upstream_answers(sends: &[u64]) -> Result<(u32, u32), BrokerError> {
    let clock = ManualClock::new();
    let upstream = ResourceBroker::new(MemoryBackend::with_clock(clock.clone()));
    upstream.register_limit("upstream", seed_quota())?;
    let mut sorted = sends.to_vec();
    sorted.sort_unstable();
    let (mut ok, mut rejected) = (0, 0);
    for at in sorted {
        clock.set(at);
        if upstream
            .try_acquire("upstream", Cost::default())
            .await?
            .allowed
        {
            ok += 1;
        } else {
            rejected += 1;
        }
    }
    Ok((ok, rejected))
}

/// The table's header, for a send-time column `width` characters wide.
pub fn header(width: usize) -> String {
    let (buckets, sent) = ("buckets", "sent at (s)");
    format!("   {buckets:<18} {sent:<width$} {:>4} {:>4}", "200", "429")
}

/// One row: the layout, the send times (µs) written with `decimals` (none:
/// exact) and what the upstream answered.
pub async fn row(
    shared: bool,
    sends: &[u64],
    decimals: Option<usize>,
    width: usize,
) -> Result<String, BrokerError> {
    let (ok, rejected) = upstream_answers(sends).await?;
    let mut sorted = sends.to_vec();
    sorted.sort_unstable();
    let times: Vec<String> = sorted
        .iter()
        .map(|&t| match decimals {
            Some(d) => format!("{:.d$}", t as f64 / 1e6),
            None => format!("{}", t as f64 / 1e6),
        })
        .collect();
    let label = if shared {
        "one shared bucket"
    } else {
        "one per worker"
    };
    let times = times.join(" ");
    Ok(format!(
        "   {label:<18} {times:<width$} {ok:>4} {rejected:>4}"
    ))
}
