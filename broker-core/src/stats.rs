//! Counters per resource and their serializable snapshot. Updating one is
//! a relaxed atomic add; nothing is logged per allowed request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

pub use crate::broker::{FlowStats, LevelStats, QueueStats};

/// Live counters of one resource.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) allowed: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) wait_micros: AtomicU64,
    pub(crate) upstream_429: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) retries_exhausted: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) backend_errors: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) reconciles: AtomicU64,
    /// The last upstream request limit logged as calibration material.
    pub(crate) observed_request_limit: AtomicU64,
    /// The last upstream token limit logged as calibration material.
    pub(crate) observed_token_limit: AtomicU64,
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

impl Counters {
    /// A snapshot of the counters, with the calls queued and in flight
    /// under the resource id (`live`).
    pub(crate) fn snapshot(&self, kind: ResourceKind, live: &Live) -> ResourceStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ResourceStats {
            kind,
            allowed: get(&self.allowed),
            denied: get(&self.denied),
            queued: get(&live.queued),
            in_flight: get(&live.in_flight),
            local_waits: get(&self.waits),
            total_wait_ms: get(&self.wait_micros) / 1000,
            upstream_429: get(&self.upstream_429),
            retries: get(&self.retries),
            retries_exhausted: get(&self.retries_exhausted),
            skipped: get(&self.skipped),
            backend_errors: get(&self.backend_errors),
            completed: get(&self.completed),
            failed: get(&self.failed),
            reconciles: get(&self.reconciles),
            queue: Default::default(),
        }
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
