//! Upstream feedback: `penalize`, `reconcile` and `settle` on a resource.

use std::time::Duration;

use super::{note_backend_error, state_key, ResourceBroker, Target};
use crate::error::BrokerError;
use crate::limits::Cost;
use crate::observed::ObservedLimit;
use crate::state::Marks;
use crate::stats::bump;

/// # Upstream feedback
impl ResourceBroker {
    /// `penalize`: after a real upstream 429, drain the resource's buckets
    /// and penalize them for `penalty` (a resource without rate limits:
    /// penalize its state in the store, see [`crate::state::penalize`]). Never shortens
    /// a longer penalty. Counted as an upstream 429 in
    /// [`ResourceBroker::stats`]. Call it before the permit of the call
    /// that got the 429 is dropped: on a resource without rate limits, a
    /// call of another process waiting for the slot would otherwise take
    /// it before the store has the penalty.
    pub async fn penalize<'a>(
        &self,
        target: impl Into<Target<'a>>,
        penalty: Duration,
    ) -> Result<(), BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        bump(&resource.counters.upstream_429);
        crate::telemetry::count(&resource.id, crate::telemetry::Signal::Upstream429);
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

    /// `reconcile`: narrow the resource's buckets to what the upstream's
    /// headers say remains. Skipped without a backend call when nothing is
    /// narrower than the configured capacity. A reset longer than the
    /// resource's wait ceiling holds for the ceiling only. An observed
    /// limit other than the configured one is logged at debug level, never
    /// applied. A resource without rate limits has no bucket to narrow: a
    /// spent counter (`remaining` 0) holds it in the store until its reset,
    /// as [`ResourceBroker::penalize`] does, without counting a 429; call
    /// it, as `penalize`, before the permit of the call whose answer it
    /// reads is dropped.
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

    /// `settle`: correct a charge after the work, from `booked` to
    /// `actual` (refund or charge the difference). A refund is not made
    /// while a penalty is on (a 429's or an exhausted upstream counter's
    /// drained what it would give back).
    ///
    /// The correction goes to the store as it is now. A cost a shared
    /// store's failure policy answered while the store was out of reach (a
    /// `try_acquire` let through open, or taken by the local fallback) was
    /// never in the store, and a refund of it made once the store is back
    /// would give the store tokens no call took: this call cannot tell such
    /// a cost apart; [`ResourceBroker::settle_since`] with the
    /// acquisition's [`crate::Acquisition::settle_marks`] settles it where it
    /// went. `enqueue` settles its own bookings where their cost went.
    pub async fn settle<'a>(
        &self,
        target: impl Into<Target<'a>>,
        booked: Cost,
        actual: Cost,
    ) -> Result<(), BrokerError> {
        self.settle_since(target, booked, actual, None).await
    }

    /// [`ResourceBroker::settle`], told where the cost went: `since` are the
    /// marks of the booking settled ([`crate::Booking::since`]), or
    /// those of an acquisition ([`crate::Acquisition::settle_marks`]):
    /// [`Marks::ANSWERED_HERE`] for a cost the store's failure policy
    /// answered while the store was out of reach, which is then settled
    /// where it went (this process's fallback bucket, or nowhere), not in
    /// the store.
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
