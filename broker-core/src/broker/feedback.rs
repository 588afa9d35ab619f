//! Upstream feedback: `penalize`, `reconcile` and `settle` on a resource,
//! and what an `enqueue` attempt's answer tells the store.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{note_backend_error, Resource, ResourceBroker, Target};
use crate::clock::tokio_after;
use crate::error::BrokerError;
use crate::limits::{Cost, Unit};
use crate::observed::ObservedLimit;
use crate::state::{LimitSpec, Marks};
use crate::telemetry;

/// # Upstream feedback
impl ResourceBroker {
    /// After an upstream 429: drains and penalizes the buckets (or the
    /// state) for `penalty`, never shortening a longer one. Call it before
    /// dropping the permit of the call that got the 429.
    pub async fn penalize<'a>(
        &self,
        target: impl Into<Target<'a>>,
        penalty: Duration,
    ) -> Result<(), BrokerError> {
        let (resource, key) = self.state_of(target.into())?;
        resource.penalties.penalize(&key, tokio_after(penalty));
        self.penalize_key(&resource, &key, penalty).await
    }

    /// Narrows the buckets to what the upstream's headers say remains
    /// (without rate limits, a spent counter penalizes the state until its
    /// reset); call it, as `penalize`, before dropping the permit.
    pub async fn reconcile<'a>(
        &self,
        target: impl Into<Target<'a>>,
        observed: &ObservedLimit,
    ) -> Result<(), BrokerError> {
        let (resource, key) = self.state_of(target.into())?;
        self.reconcile_key(&resource, &key, observed).await
    }

    /// Corrects a charge after the work from `booked` to `actual` in the store, where it went:
    /// `since`, the marks of a booking ([`crate::Booking::since`]) or of an acquisition
    /// ([`crate::Acquisition::settle_marks`]), if known. No refund while a penalty is on.
    ///
    /// ```
    /// # use broker_core::{Cost, ResourceBroker};
    /// # async fn refund(broker: &ResourceBroker) -> Result<(), broker_core::BrokerError> {
    /// let taken = broker.try_acquire("webhooks", Cost::requests(1)).await?;
    /// // Admitted, then refused further on: the cost goes back where it
    /// // was taken.
    /// broker
    ///     .settle("webhooks", Cost::requests(1), Cost::requests(0), taken.settle_marks())
    ///     .await
    /// # }
    /// ```
    pub async fn settle<'a>(
        &self,
        target: impl Into<Target<'a>>,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BrokerError> {
        let (resource, key) = self.state_of(target.into())?;
        self.inner
            .backend
            .settle(&key, &resource.spec, booked, actual, since)
            .await
            .inspect_err(|e| note_backend_error(&resource, "settle", e))?;
        Ok(())
    }
}

/// # Upstream feedback of `enqueue`
impl ResourceBroker {
    /// Counts an upstream 429 on `resource` and penalizes its state `key`
    /// in the store for `penalty`.
    pub(super) async fn penalize_key(
        &self,
        resource: &Resource,
        key: &str,
        penalty: Duration,
    ) -> Result<(), BrokerError> {
        resource.tally(|c| &c.upstream_429, 1);
        telemetry::count(&resource.id, telemetry::UPSTREAM_429);
        let spec = resource.latest().spec.clone();
        (self.inner.backend.penalize(key, &spec, penalty).await)
            .inspect_err(|e| note_backend_error(resource, "penalize", e))?;
        Ok(())
    }

    /// `reconcile` on state `key`: resets capped at the wait ceiling, an
    /// observed limit other than the configured one logged (never applied),
    /// and no backend call when nothing would narrow.
    pub(crate) async fn reconcile_key(
        &self,
        resource: &Arc<Resource>,
        key: &str,
        observed: &ObservedLimit,
    ) -> Result<(), BrokerError> {
        let observed = &capped_resets(resource, observed);
        note_calibration(resource, observed);
        let spec = &resource.latest().spec;
        // No bucket to narrow: a spent counter penalizes the state until
        // its reset.
        let spent = spec.buckets.is_empty().then(|| spent_reset(observed, spec));
        if spent.map_or_else(|| spec.reconcile_is_noop(observed), |r| r.is_none()) {
            return Ok(());
        }
        penalize_spent_counters(resource, key, observed);
        let backend = &self.inner.backend;
        match spent.flatten() {
            Some(reset) => backend.penalize(key, spec, reset).await,
            None => backend.reconcile(key, spec, observed).await,
        }
        .inspect_err(|e| note_backend_error(resource, "reconcile", e))?;
        resource.tally(|c| &c.reconciles, 1);
        telemetry::count(&resource.id, telemetry::RECONCILES);
        Ok(())
    }
}

/// `observed` with every reset at most the resource's wait ceiling.
pub(super) fn capped_resets(resource: &Resource, observed: &ObservedLimit) -> ObservedLimit {
    let config = &resource.config;
    let ceiling = config.retry.ceiling(&config.paced_limits());
    let mut capped = observed.clone();
    for o in capped.requests.iter_mut().chain(capped.tokens.iter_mut()) {
        o.reset = o.reset.map(|r| r.min(ceiling));
    }
    capped
}

/// Penalizes `key` in this process until the reset of every spent counter
/// of `capped` with a bucket of its unit (without rate limits: of any
/// spent counter), as the store's `reconcile` makes new bookings wait.
pub(super) fn penalize_spent_counters(resource: &Arc<Resource>, key: &str, capped: &ObservedLimit) {
    if let Some(reset) = spent_reset(capped, &resource.latest().spec) {
        resource.penalties.penalize(key, tokio_after(reset));
    }
}

/// The latest reset among the spent counters of `observed` with a bucket
/// of their unit in `spec` (without rate limits: among all of them).
fn spent_reset(observed: &ObservedLimit, spec: &LimitSpec) -> Option<Duration> {
    let bucketed = |unit| spec.buckets.is_empty() || spec.buckets.iter().any(|(u, _)| *u == unit);
    [Unit::Requests, Unit::Tokens]
        .into_iter()
        .filter(|unit| bucketed(*unit))
        .filter_map(|unit| observed.of(unit))
        .filter(|o| o.remaining == Some(0))
        .filter_map(|o| o.reset)
        .max()
}

/// Logs at debug level (once per value) an upstream limit other than the
/// configured burst of the bucket its counter describes.
fn note_calibration(resource: &Resource, observed: &ObservedLimit) {
    for (i, rate) in resource.config.limits.rates.iter().enumerate() {
        let described = crate::state::observed_for(&resource.spec, observed, i);
        let configured = rate.burst();
        let Some(limit) = described.and_then(|o| o.limit).filter(|l| *l != configured) else {
            continue;
        };
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
