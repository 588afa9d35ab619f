//! Counters per resource and their serializable snapshot. Updating one is
//! a relaxed atomic add; nothing is logged per allowed request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::broker::Priority;

/// Defines the live [`Counters`] of a resource and their snapshot: each
/// named one is read into the [`ResourceStats`] field of its name.
macro_rules! counters {
    ($($name:ident),*) => {
        /// Live counters of one resource.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
            pub(crate) waits: AtomicU64,
            pub(crate) wait_micros: AtomicU64,
            /// The last upstream request limit logged as calibration material.
            pub(crate) observed_request_limit: AtomicU64,
            /// The last upstream token limit logged as calibration material.
            pub(crate) observed_token_limit: AtomicU64,
        }

        impl Counters {
            /// A snapshot of the counters, with the calls queued and in flight
            /// under the resource id (`live`) and its `queue`.
            pub(crate) fn snapshot(
                &self,
                kind: ResourceKind,
                live: &Live,
                queue: QueueStats,
            ) -> ResourceStats {
                let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
                ResourceStats {
                    $($name: get(&self.$name),)*
                    kind,
                    queued: get(&live.queued),
                    in_flight: get(&live.in_flight),
                    local_waits: get(&self.waits),
                    total_wait_ms: get(&self.wait_micros) / 1000,
                    queue,
                }
            }
        }
    };
}

counters! {
    allowed, denied, upstream_429, retries, retries_exhausted, skipped, backend_errors, completed,
    failed, reconciles
}

/// The calls waiting and the work running (or permits held) under one
/// resource id, shared by its registrations.
#[derive(Debug, Default)]
pub(crate) struct Live {
    pub(crate) queued: AtomicU64,
    pub(crate) in_flight: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    add(c, 1);
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn drop_one(c: &AtomicU64) {
    c.fetch_sub(1, Ordering::Relaxed);
}

/// Counts one call on a counter (counted by its maker) until dropped.
pub(crate) struct Counted<'r>(pub(crate) &'r AtomicU64);

impl<'r> Counted<'r> {
    /// Moves the call to `counter`.
    pub(crate) fn move_to(&mut self, counter: &'r AtomicU64) {
        drop_one(self.0);
        bump(counter);
        self.0 = counter;
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        drop_one(self.0);
    }
}

/// How a resource is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceKind {
    /// Registered with `register`: has a queue (`enqueue`).
    Queue,
    /// Registered with `register_limit`: for check + reject.
    LimitOnly,
}

/// A snapshot of one resource's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStats {
    /// Queue resource or limit-only.
    pub kind: ResourceKind,
    /// Acquisitions granted (try, acquire and enqueue attempts).
    pub allowed: u64,
    /// Acquisitions denied (try and acquire).
    pub denied: u64,
    /// `enqueue` calls waiting now.
    pub queued: u64,
    /// Work running (or permits held) now, also on a registration of the
    /// resource that a later one replaced.
    pub in_flight: u64,
    /// Times a caller waited on the local limiter.
    pub local_waits: u64,
    /// Total time spent in those waits.
    pub total_wait_ms: u64,
    /// Upstream 429s reported by the work.
    pub upstream_429: u64,
    /// Attempts retried.
    pub retries: u64,
    /// `enqueue` calls that ran out of retry budget.
    pub retries_exhausted: u64,
    /// Acquisitions answered with skip-and-reschedule.
    pub skipped: u64,
    /// Store errors that reached the broker (those a backend's failure
    /// policy answered are in `BackendHealth::handled_errors`).
    pub backend_errors: u64,
    /// `enqueue` calls that finished successfully.
    pub completed: u64,
    /// `enqueue` calls that ended in an error.
    pub failed: u64,
    /// Upstream headers that narrowed a bucket (or, without rate limits,
    /// penalized the state until a spent counter's reset).
    #[serde(default)]
    pub reconciles: u64,
    /// The `enqueue` queue: calls waiting for their turn per priority,
    /// the busiest flows, wait-time percentiles.
    #[serde(default)]
    pub queue: QueueStats,
}

/// Snapshot of every resource, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerStats {
    /// Per resource.
    pub resources: BTreeMap<String, ResourceStats>,
    /// The state store's reachability and the calls its failure policy
    /// answered.
    #[serde(default)]
    pub backend: BackendHealth,
}

/// Reachability of a shared state store, as its failure policy saw it
/// (see [`crate::Store::health`]). In-memory stores are never down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendHealth {
    /// The store is unreachable now; the failure policy answers.
    pub down: bool,
    /// Outages seen since start (each logged once).
    pub outages: u64,
    /// Calls answered by the failure policy because the store was
    /// unreachable (fail-closed errors included).
    pub handled_errors: u64,
}

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
        let counts = self.0.each_ref().map(|c| c.load(Ordering::Relaxed));
        let total: u64 = counts.iter().sum();
        let out = qs.map(|q| {
            let rank = (total * q).div_ceil(1000).max(1);
            let mut seen = 0;
            // Found whenever there is a count (`rank <= total`).
            let at = counts.iter().position(|c| {
                seen += c;
                seen >= rank
            });
            at.map_or(0, |i| 1 << i)
        });
        (total, out)
    }
}

/// The queue of one resource in [`crate::ResourceStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStats {
    /// Per priority, highest first.
    pub levels: Vec<LevelStats>,
    /// The flows with the most calls waiting for their turn (at most 10),
    /// by fingerprint.
    pub busiest_flows: Vec<FlowStats>,
}

/// One priority level of a queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
pub(crate) fn queue_snapshot(
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
