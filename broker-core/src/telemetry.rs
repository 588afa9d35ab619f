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

pub(crate) const LOCAL_WAITS: &str = "resource_broker_local_waits_total";
pub(crate) const UPSTREAM_429: &str = "resource_broker_upstream_429_total";
pub(crate) const RETRIES_EXHAUSTED: &str = "resource_broker_retries_exhausted_total";
pub(crate) const SKIPPED: &str = "resource_broker_skipped_total";
pub(crate) const RECONCILES: &str = "resource_broker_reconciles_total";

/// Counts `metric` (one of the `resource`-labelled ones above) for `resource`.
pub(crate) fn count(resource: &str, metric: &'static str) {
    metrics::counter!(metric, "resource" => resource.to_owned()).increment(1);
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
