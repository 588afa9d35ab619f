//! Counters through the [`metrics`] facade.
//!
//! | metric | labels | counts |
//! |---|---|---|
//! | `resource_broker_local_waits_total` | `resource` | waits on our own limiter before sending |
//! | `resource_broker_upstream_429_total` | `resource` | real 429s from the upstream |
//! | `resource_broker_retries_exhausted_total` | `resource` | `enqueue` calls that ran out of retry budget |
//! | `resource_broker_skipped_total` | `resource` | skip-and-reschedule answers |
//! | `resource_broker_reconciles_total` | `resource` | upstream headers that narrowed a bucket, or penalized a resource without rate limits until a spent counter's reset |
//! | `resource_broker_backend_errors_total` | `resource`, `op` | backend errors seen by the broker |
//! | `resource_broker_backend_fallbacks_total` | `policy`, `op` | backend errors a backend handled by its failure policy |
//! | `resource_broker_egress_requests_total` | `supplier`, `ip` | requests a supplier's egress IP counter saw ([`crate::supplier`]) |

/// One event worth a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A caller waited on the local limiter.
    LocalWait,
    /// The upstream answered 429.
    Upstream429,
    /// An `enqueue` call ran out of retry budget.
    RetriesExhausted,
    /// A data bucket answered skip-and-reschedule.
    Skipped,
    /// Upstream headers narrowed a bucket (or penalized a resource).
    Reconciled,
}

impl Signal {
    /// The metric name.
    pub fn metric(self) -> &'static str {
        match self {
            Signal::LocalWait => "resource_broker_local_waits_total",
            Signal::Upstream429 => "resource_broker_upstream_429_total",
            Signal::RetriesExhausted => "resource_broker_retries_exhausted_total",
            Signal::Skipped => "resource_broker_skipped_total",
            Signal::Reconciled => "resource_broker_reconciles_total",
        }
    }
}

/// Counts `signal` for `resource`.
pub fn count(resource: &str, signal: Signal) {
    metrics::counter!(signal.metric(), "resource" => resource.to_owned()).increment(1);
}

/// Counts a backend error the broker saw on `op` for `resource`.
pub fn backend_error(resource: &str, op: &'static str) {
    metrics::counter!(
        "resource_broker_backend_errors_total",
        "resource" => resource.to_owned(),
        "op" => op
    )
    .increment(1);
}

/// For backends: counts a store error the failure policy absorbed.
pub fn fallback_used(policy: &'static str, op: &'static str) {
    metrics::counter!(
        "resource_broker_backend_fallbacks_total",
        "policy" => policy,
        "op" => op
    )
    .increment(1);
}
