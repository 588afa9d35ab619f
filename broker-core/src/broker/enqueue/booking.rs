//! Bookings made in the store: refunded when dropped unused, and settled
//! after the work.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::broker::in_flight::to_its_answer;
use crate::broker::permit;
use crate::broker::{note_backend_error, Epochs, HeldKey, Resource};
use crate::clock::Micros;
use crate::error::{BackendError, BrokerError};
use crate::limits::Cost;
use crate::state::{Decision, LeaseId, Marks};
use crate::telemetry;

/// A cost taken in the store (a booking, or an allowed `try` decision's).
/// Dropped before [`LiveBooking::consume`] or [`LiveBooking::claim`], it
/// refunds the cost (unless a penalty drained it) and frees its slot.
pub(crate) struct LiveBooking {
    resource: Arc<Resource>,
    /// The epochs of the limits it was taken under.
    booked_under: Epochs,
    /// The state (`None`: the resource's own).
    key: Option<String>,
    cost: Cost,
    pub(super) wait: Micros,
    /// Its marks on the store's clock (`None`: unknown, a `try` decision's).
    since: Option<Marks>,
    /// The same here: when it was asked, or the end of the local penalty
    /// it was asked under if later.
    since_here: Instant,
    /// The slot its `try` decision took.
    lease: Option<LeaseId>,
    armed: bool,
}

impl LiveBooking {
    /// `cost`, taken by the `try` decision `d` on state `key` under
    /// `resource`'s own limits, asked at `since_here`; armed if allowed.
    pub(crate) fn taken(
        resource: Arc<Resource>,
        key: Option<String>,
        cost: Cost,
        since_here: Instant,
        d: &Decision,
    ) -> Self {
        Self {
            booked_under: resource.epochs,
            resource,
            key,
            cost,
            wait: 0,
            since: d.answered_here.then_some(Marks::ANSWERED_HERE),
            since_here,
            lease: d.lease.filter(|_| d.allowed),
            armed: d.allowed,
        }
    }

    /// The time of a call on `key` now, or the end of its penalty if later.
    pub(crate) fn since_here(resource: &Resource, key: &str) -> Instant {
        (resource.penalties.until(key)).unwrap_or_else(Instant::now)
    }

    /// Books `cost` within `max_wait`: `Ok(Ok(booking))`, or `Ok(Err(wait))`
    /// when the earliest time is beyond `max_wait` (nothing booked).
    pub(crate) async fn book(
        resource: &Arc<Resource>,
        key: String,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Result<LiveBooking, Micros>, BrokerError> {
        let latest = resource.latest();
        let resource = resource.clone();
        // Run to its answer if the caller goes away: dropped, it refunds.
        to_its_answer(async move {
            let booked = resource.backend.book(&key, &latest.spec, cost, max_wait);
            let r = (booked.await).inspect_err(|e| note_backend_error(&resource, "book", e))?;
            if !r.booked {
                return Ok(Err(r.wait));
            }
            let since_here = Self::since_here(&resource, &key);
            let allowed = Decision::allow(None);
            let mut b = Self::taken(resource, Some(key), cost, since_here, &allowed);
            (b.booked_under, b.wait, b.since) = (latest.epochs, r.wait, Some(r.since));
            Ok(Ok(b))
        })
        .await
    }

    fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(&self.resource.key)
    }

    /// Sleeps until the booked time, counted as a local limiter wait (also
    /// when the call is dropped before the end).
    pub(crate) async fn sleep_until_due(&self) {
        if self.wait > 0 {
            self.resource.tally(|c| &c.waits, 1);
            telemetry::count(&self.resource.id, telemetry::LOCAL_WAITS);
            // The µs since the start (the booked wait at most), once over.
            let start = Instant::now();
            scopeguard::defer! {
                let waited = crate::clock::micros(start.elapsed());
                self.resource.tally(|c| &c.wait_micros, waited.min(self.wait));
            }
            tokio::time::sleep(Duration::from_micros(self.wait)).await;
        }
    }

    /// The booking is used: no refund on drop.
    pub(crate) fn consume(mut self) -> Self {
        self.armed = false;
        self
    }

    /// The cost and slot are held by the caller now: no refund on drop; its key.
    pub(crate) fn claim(mut self) -> Option<String> {
        self.armed = false;
        self.key.take()
    }

    /// Whether a shared store's failure policy answered the booking.
    pub(crate) fn answered_here(&self) -> bool {
        self.since == Some(Marks::ANSWERED_HERE)
    }

    /// Settles `usage` (`None`: the booked cost) on the latest limits, at
    /// once in process, else on a returned task; after a penalty since
    /// (`penalty_end`) the unused part stays spent.
    pub(crate) fn settle(
        &self,
        usage: Option<Cost>,
        penalty_end: Option<Instant>,
        op: &'static str,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (latest, cost, none) = (self.resource.latest(), self.cost, Cost::requests(0));
        // The marks to settle with: kept if the limits did not change or a
        // failure policy answered; none when the buckets changed, so the
        // state may have been started afresh.
        let keep = latest.epochs.limits == self.booked_under.limits || self.answered_here();
        let (booked, actual, since) = if latest.epochs.buckets != self.booked_under.buckets {
            let actual = usage.unwrap_or(cost);
            (actual != none).then_some((none, actual, None))?
        } else {
            let mut actual = usage?;
            if penalty_end.is_some_and(|until| until > self.since_here) {
                actual.requests = actual.requests.max(cost.requests);
                actual.tokens = actual.tokens.max(cost.tokens);
            }
            (actual != cost).then_some((cost, actual, self.since.filter(|_| keep)))?
        };
        // Time given back wakes the head of the key's line.
        let gave_back = actual.requests < booked.requests || actual.tokens < booked.tokens;
        let settled = move |resource: &Resource, key: &str, r: Result<(), BackendError>| {
            let _ = r.inspect_err(|e| note_backend_error(resource, op, e));
            if gave_back {
                resource.lines.gave_back(key);
            }
        };
        let (key, spec) = (self.key(), &latest.spec);
        let local = self.resource.backend.local();
        if let Some(r) = local.and_then(|l| l.settle_now(key, spec, booked, actual, since)) {
            settled(&self.resource, key, r);
            return None;
        }
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let resource = self.resource.clone();
        let (key, spec) = (key.to_owned(), spec.clone());
        Some(rt.spawn(async move {
            let settling = resource.backend.settle(&key, &spec, booked, actual, since);
            settled(&resource, &key, settling.await);
        }))
    }
}

impl Drop for LiveBooking {
    /// Frees the slot of an unclaimed `try` decision, then refunds an
    /// unused booking, unless a penalty put on since drained it.
    fn drop(&mut self) {
        if self.armed {
            if let Some(lease) = self.lease {
                let key = HeldKey::State(self.key.clone());
                permit::release(self.resource.clone(), key, lease, false);
            }
            let penalty_end = self.resource.penalties.until(self.key());
            let _ = self.settle(Some(Cost::requests(0)), penalty_end, "refund");
        }
    }
}
