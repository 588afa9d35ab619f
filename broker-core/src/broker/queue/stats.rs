//! What the queue shows in `stats()`: wait times per priority in a
//! histogram of log buckets, and the snapshot types.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::broker::Priority;

/// Buckets of the histogram: bucket 0 counts waits under 1 ms, bucket `i`
/// those in `[2^(i-1), 2^i)` ms; the last also every longer one.
const BUCKETS: usize = 40;

/// The waits of `enqueue` calls of one priority for their first attempt.
#[derive(Debug)]
pub(crate) struct Histogram([AtomicU64; BUCKETS]);

impl Default for Histogram {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Histogram {
    pub(crate) fn record(&self, wait: Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let bucket = (64 - ms.leading_zeros() as usize).min(BUCKETS - 1);
        self.0[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The count, and the upper bound (ms) of the bucket holding each
    /// quantile of `qs` (per mille).
    fn quantiles<const N: usize>(&self, qs: [u64; N]) -> (u64, [u64; N]) {
        let counts: Vec<u64> = self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let out = qs.map(|q| {
            if total == 0 {
                return 0;
            }
            let rank = (total * q).div_ceil(1000).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return if i == 0 { 1 } else { 1u64 << i.min(63) };
                }
            }
            u64::MAX
        });
        (total, out)
    }
}

/// The queue of one resource in [`crate::ResourceStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStats {
    /// Per priority, highest first.
    pub levels: Vec<LevelStats>,
    /// The flows with the most calls waiting for their turn (at most 10),
    /// by fingerprint.
    pub busiest_flows: Vec<FlowStats>,
}

/// One priority level of a queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LevelStats {
    /// `interactive`, `default` or `batch`.
    pub priority: String,
    /// Calls waiting for their turn to book now.
    pub depth: u64,
    /// Calls that got their first attempt since the start.
    pub waits: u64,
    /// Median wait for the first attempt, ms (the upper bound of a
    /// power-of-two bucket).
    pub p50_ms: u64,
    /// 90th percentile, as `p50_ms`.
    pub p90_ms: u64,
    /// 99th percentile, as `p50_ms`.
    pub p99_ms: u64,
}

/// One flow of a queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlowStats {
    /// The flow key's fingerprint.
    pub flow: String,
    /// Calls waiting for their turn.
    pub queued: u64,
    /// Their cost, as the time it refills in the slowest bucket, ms.
    pub queued_cost_ms: u64,
}

/// The stats of a queue with `depth` waiting per priority and `flows`.
pub(crate) fn snapshot(
    waits: &[Histogram; 3],
    depth: [u64; 3],
    mut flows: Vec<FlowStats>,
) -> QueueStats {
    let levels = Priority::ALL
        .iter()
        .rev()
        .map(|&p| {
            let (count, [p50, p90, p99]) = waits[p.index()].quantiles([500, 900, 990]);
            LevelStats {
                priority: p.as_str().to_owned(),
                depth: depth[p.index()],
                waits: count,
                p50_ms: p50,
                p90_ms: p90,
                p99_ms: p99,
            }
        })
        .collect();
    flows.sort_by_key(|f| std::cmp::Reverse((f.queued, f.queued_cost_ms)));
    flows.truncate(10);
    QueueStats {
        levels,
        busiest_flows: flows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_upper_bounds() {
        let h = Histogram::default();
        for ms in [0u64, 3, 3, 3, 100] {
            h.record(Duration::from_millis(ms));
        }
        let (n, [p50, p99]) = h.quantiles([500, 990]);
        assert_eq!((n, p50, p99), (5, 4, 128));
    }
}
