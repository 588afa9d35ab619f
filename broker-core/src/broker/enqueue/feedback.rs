//! What an upstream's answer tells the store: a 429's penalty, and the
//! counters of its headers reconciled.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::in_flight::to_its_answer;
use crate::broker::{note_backend_error, Resource, ResourceBroker};
use crate::error::BrokerError;
use crate::limits::Unit;
use crate::observed::ObservedLimit;
use crate::stats::bump;
use crate::telemetry::{self, Signal};

/// # Upstream feedback of `enqueue`
impl ResourceBroker {
    /// After a real upstream 429: count it, log it, and penalize the bucket
    /// for `penalty` (protects every other consumer of it); this process's
    /// own penalty is on already, put on before the call's slot was freed (on a
    /// resource without rate limits, so is this penalty: see the call).
    /// Runs on the last attempt too, so the next run does not start into
    /// the closed window.
    /// A failed penalize is logged; the 429 stays the caller's outcome.
    pub(super) async fn note_upstream_429(
        &self,
        resource: &Arc<Resource>,
        key: &str,
        attempt: u32,
        retry_after: Option<Duration>,
        penalty: Duration,
    ) {
        bump(&resource.tally().counters.upstream_429);
        telemetry::count(&resource.id, Signal::Upstream429);
        tracing::info!(
            resource = %resource.id,
            attempt,
            retry_after_ms = retry_after.map(|d| d.as_millis() as u64),
            hold_ms = penalty.as_millis() as u64,
            "upstream 429"
        );
        let (backend, resource) = (self.inner.backend.clone(), resource.clone());
        let (key, spec) = (key.to_owned(), resource.latest().spec.clone());
        // Run to its end even if this call is dropped meanwhile (a timeout
        // around `enqueue`): cut off, the penalty would leave the other
        // replicas sending into the upstream's refusal.
        to_its_answer(async move {
            if let Err(e) = backend.penalize(&key, &spec, penalty).await {
                note_backend_error(&resource, "penalize", &e);
            }
        })
        .await;
    }

    /// `reconcile` with the checks every caller gets: an observed limit
    /// other than the configured capacity is logged at debug level (once
    /// per distinct value) as calibration material and never applied; the
    /// backend is not called when nothing would narrow; a reset is capped
    /// at the wait ceiling, as a `Retry-After` is.
    pub(crate) async fn reconcile_key(
        &self,
        resource: &Arc<Resource>,
        key: &str,
        observed: &ObservedLimit,
    ) -> Result<(), BrokerError> {
        // One reading for every step: the resets capped, as the store is
        // given them (a reset picks the bucket a counter describes).
        let observed = &capped_resets(resource, observed);
        note_calibration(resource, observed);
        let spec = &resource.latest().spec;
        // No bucket for a counter to narrow: a spent one penalizes the state
        // until its reset, in the store as a penalty does, so every
        // replica waits it out.
        let spent = spec.buckets.is_empty().then(|| spent_reset(observed));
        let noop = match spent {
            Some(reset) => reset.is_none(),
            None => spec.reconcile_is_noop(observed),
        };
        if noop {
            return Ok(());
        }
        penalize_spent_counters(resource, key, observed);
        let backend = &self.inner.backend;
        match spent.flatten() {
            Some(reset) => backend.penalize(key, spec, reset).await,
            None => backend.reconcile(key, spec, observed).await,
        }
        .inspect_err(|e| note_backend_error(resource, "reconcile", e))?;
        bump(&resource.tally().counters.reconciles);
        telemetry::count(&resource.id, Signal::Reconciled);
        Ok(())
    }
}

/// `observed` with every reset at most the resource's wait ceiling: the
/// one ceiling bounds a penalty for a spent counter as it bounds a
/// `Retry-After`, so a reset of hours does not fail the next attempt's
/// wait on our side.
pub(super) fn capped_resets(resource: &Resource, observed: &ObservedLimit) -> ObservedLimit {
    let ceiling = resource
        .config
        .retry
        .ceiling(&resource.config.paced_limits());
    cap_resets(observed, ceiling)
}

/// Penalizes `key` in this process until the reset of every counter of
/// `capped` (`observed` as [`capped_resets`] gives it) that is spent
/// (`remaining == 0`) and has a bucket of its unit in the resource's
/// latest limits, so that what is booked here already waits as the
/// store's `reconcile` makes new bookings wait (see `state::reconcile`).
/// A resource without rate limits is penalized until the latest reset of any
/// spent counter, as the store holds it (see `reconcile_key`).
pub(super) fn penalize_spent_counters(resource: &Arc<Resource>, key: &str, capped: &ObservedLimit) {
    let buckets = &resource.latest().spec.buckets;
    if buckets.is_empty() {
        if let Some(reset) = spent_reset(capped) {
            resource
                .penalties
                .penalize(key, crate::clock::tokio_after(reset));
        }
        return;
    }
    for (unit, _) in buckets {
        if let Some(o) = capped.of(*unit).filter(|o| o.remaining == Some(0)) {
            if let Some(reset) = o.reset {
                resource
                    .penalties
                    .penalize(key, crate::clock::tokio_after(reset));
            }
        }
    }
}

/// The latest reset among the counters of `observed` that are spent
/// (`remaining == 0`), of either unit; `None` when none is spent, or none
/// that is says when it resets.
fn spent_reset(observed: &ObservedLimit) -> Option<Duration> {
    [&observed.requests, &observed.tokens]
        .into_iter()
        .flatten()
        .filter(|o| o.remaining == Some(0))
        .filter_map(|o| o.reset)
        .max()
}

/// `observed` with every reset at most `ceiling`.
fn cap_resets(observed: &ObservedLimit, ceiling: Duration) -> ObservedLimit {
    let cap = |o: &Option<crate::observed::Observed>| {
        o.clone().map(|mut o| {
            o.reset = o.reset.map(|r| r.min(ceiling));
            o
        })
    };
    ObservedLimit {
        requests: cap(&observed.requests),
        tokens: cap(&observed.tokens),
        retry_after: observed.retry_after,
    }
}

/// Logs, at debug level, an upstream limit that differs from the configured
/// capacity of the bucket its counter describes (with several limits of
/// one unit, the one [`crate::state::observed_for`] picks, as `reconcile`
/// does): material for a deliberate edit of the registry, never applied
/// automatically (a wider bucket could let several of our buckets under
/// one upstream budget overspend it).
fn note_calibration(resource: &Resource, observed: &ObservedLimit) {
    for (i, rate) in resource.config.limits.rates.iter().enumerate() {
        let described = crate::state::observed_for(&resource.spec, observed, i);
        let Some(limit) = described.and_then(|o| o.limit) else {
            continue;
        };
        let configured = rate.burst();
        if limit == configured {
            continue;
        }
        let last = match rate.unit {
            Unit::Requests => &resource.counters.observed_request_limit,
            Unit::Tokens => &resource.counters.observed_token_limit,
        };
        if last.swap(limit, Ordering::Relaxed) != limit {
            tracing::debug!(
                resource = %resource.id,
                unit = rate.unit.as_str(),
                observed_limit = limit,
                configured,
                "upstream reports a limit other than the configured one (not applied)"
            );
        }
    }
}
