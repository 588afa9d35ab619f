//! Upstream feedback: `penalize`, `reconcile` and `settle` on a resource,
//! and what an `enqueue` attempt's answer tells the store.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::in_flight::to_its_answer;
use super::{note_backend_error, state_key, Resource, ResourceBroker, Target};
use crate::error::BrokerError;
use crate::limits::{Cost, Unit};
use crate::observed::ObservedLimit;
use crate::state::Marks;
use crate::stats::bump;
use crate::telemetry::{self, Signal};

/// # Upstream feedback
impl ResourceBroker {
    /// After an upstream 429: drains the resource's buckets and penalizes
    /// them (or, without rate limits, its state) for `penalty`, never
    /// shortening a longer one; counted as an upstream 429. Call it before
    /// dropping the permit of the call that got the 429.
    pub async fn penalize<'a>(
        &self,
        target: impl Into<Target<'a>>,
        penalty: Duration,
    ) -> Result<(), BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        bump(&resource.counters.upstream_429);
        telemetry::count(&resource.id, Signal::Upstream429);
        let owned = state_key(&resource, target.key);
        let key = owned.as_deref().unwrap_or(&resource.key);
        resource
            .penalties
            .penalize(key, crate::clock::tokio_after(penalty));
        self.inner
            .backend
            .penalize(key, &resource.spec, penalty)
            .await
            .inspect_err(|e| note_backend_error(&resource, "penalize", e))?;
        Ok(())
    }

    /// Narrows the resource's buckets to what the upstream's headers say
    /// remains (no backend call when nothing narrows); a reset counts up to
    /// the wait ceiling. Without rate limits, a spent counter penalizes the
    /// state until its reset: call it, as `penalize`, before dropping the
    /// permit.
    pub async fn reconcile<'a>(
        &self,
        target: impl Into<Target<'a>>,
        observed: &ObservedLimit,
    ) -> Result<(), BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        let owned = state_key(&resource, target.key);
        let key = owned.as_deref().unwrap_or(&resource.key);
        self.reconcile_key(&resource, key, observed).await
    }

    /// Corrects a charge after the work from `booked` to `actual`; no
    /// refund while a penalty is on. The correction goes to the store: for
    /// a cost the store's failure policy answered, use
    /// [`ResourceBroker::settle_since`].
    pub async fn settle<'a>(
        &self,
        target: impl Into<Target<'a>>,
        booked: Cost,
        actual: Cost,
    ) -> Result<(), BrokerError> {
        self.settle_since(target, booked, actual, None).await
    }

    /// [`ResourceBroker::settle`], told where the cost went: the marks of
    /// a booking ([`crate::Booking::since`]) or of an acquisition
    /// ([`crate::Acquisition::settle_marks`]).
    ///
    /// ```
    /// # use broker_core::{Cost, ResourceBroker};
    /// # async fn refund(broker: &ResourceBroker) -> Result<(), broker_core::BrokerError> {
    /// let taken = broker.try_acquire("webhooks", Cost::requests(1)).await?;
    /// // Admitted, then refused further on: the cost goes back where it
    /// // was taken.
    /// broker
    ///     .settle_since("webhooks", Cost::requests(1), Cost::requests(0), taken.settle_marks())
    ///     .await
    /// # }
    /// ```
    pub async fn settle_since<'a>(
        &self,
        target: impl Into<Target<'a>>,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        let owned = state_key(&resource, target.key);
        let key = owned.as_deref().unwrap_or(&resource.key);
        self.inner
            .backend
            .settle(key, &resource.spec, booked, actual, since)
            .await
            .inspect_err(|e| note_backend_error(&resource, "settle", e))?;
        Ok(())
    }
}

/// # Upstream feedback of `enqueue`
impl ResourceBroker {
    /// After an upstream 429: counts, logs and penalizes the state in the
    /// store for `penalty` (this process's penalty is on already). A failed
    /// penalize is logged.
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
        to_its_answer(async move {
            if let Err(e) = backend.penalize(&key, &spec, penalty).await {
                note_backend_error(&resource, "penalize", &e);
            }
        })
        .await;
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

/// `observed` with every reset at most the resource's wait ceiling.
pub(super) fn capped_resets(resource: &Resource, observed: &ObservedLimit) -> ObservedLimit {
    let ceiling = resource
        .config
        .retry
        .ceiling(&resource.config.paced_limits());
    cap_resets(observed, ceiling)
}

/// Penalizes `key` in this process until the reset of every spent counter
/// of `capped` with a bucket of its unit (without rate limits: of any
/// spent counter), as the store's `reconcile` makes new bookings wait.
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

/// The latest reset among the spent counters of `observed`.
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

/// Logs at debug level (once per value) an upstream limit other than the
/// configured burst of the bucket its counter describes.
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
