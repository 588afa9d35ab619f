//! Bookings made in the store: refunded when dropped unused, and settled
//! after the work.

use std::sync::Arc;
use std::time::Duration;

use crate::broker::in_flight::to_its_answer;
use crate::broker::{note_backend_error, Epochs, Resource, ResourceBroker};
use crate::clock::Micros;
use crate::error::{BackendError, BrokerError};
use crate::limits::Cost;
use crate::state::{LimitSpec, Marks};
use crate::store::Store;
use crate::telemetry;

pub(crate) const NO_COST: Cost = Cost {
    requests: 0,
    tokens: 0,
};

/// A cost taken in the store (a booking, or an allowed `try` decision's).
/// Dropped before [`LiveBooking::consume`], it refunds the cost, unless a
/// penalty put on since has drained it.
pub(crate) struct LiveBooking {
    pub(crate) backend: Arc<dyn Store>,
    pub(crate) resource: Arc<Resource>,
    /// The epochs of the limits it was taken under.
    booked_under: Epochs,
    /// The state (`None`: the resource's own).
    pub(crate) key: Option<String>,
    cost: Cost,
    pub(super) wait: Micros,
    /// Its marks on the store's clock (`None`: unknown, a `try` decision's).
    since: Option<Marks>,
    /// The same here: when it was asked, or the end of the local penalty
    /// it was asked under if later.
    since_here: tokio::time::Instant,
    armed: bool,
}

impl LiveBooking {
    /// `cost`, taken on state `key` under `resource`'s own limits, asked
    /// at `since_here`; refunded when dropped only if `armed`.
    pub(crate) fn taken(
        backend: Arc<dyn Store>,
        resource: Arc<Resource>,
        key: Option<String>,
        cost: Cost,
        since: Option<Marks>,
        since_here: tokio::time::Instant,
        armed: bool,
    ) -> Self {
        Self {
            backend,
            booked_under: resource.epochs,
            resource,
            key,
            cost,
            wait: 0,
            since,
            since_here,
            armed,
        }
    }

    /// The time of a call on `key` now, or the end of its penalty if later.
    pub(crate) fn since_here(resource: &Resource, key: &str) -> tokio::time::Instant {
        (resource.penalties.until(key)).unwrap_or_else(tokio::time::Instant::now)
    }

    /// Books `cost` within `max_wait`: `Ok(Ok(booking))`, or `Ok(Err(wait))`
    /// when the earliest time is beyond `max_wait` (nothing booked).
    pub(crate) async fn book(
        broker: &ResourceBroker,
        resource: &Arc<Resource>,
        key: String,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Result<LiveBooking, Micros>, BrokerError> {
        let latest = resource.latest();
        let backend = broker.inner.backend.clone();
        let resource = resource.clone();
        // Run to its answer if the caller goes away: dropped, it refunds.
        to_its_answer(async move {
            let r = backend
                .book(&key, &latest.spec, cost, max_wait)
                .await
                .inspect_err(|e| note_backend_error(&resource, "book", e))?;
            if !r.booked {
                return Ok(Err(r.wait));
            }
            let since_here = Self::since_here(&resource, &key);
            let (key, since) = (Some(key), Some(r.since));
            let mut booking = Self::taken(backend, resource, key, cost, since, since_here, true);
            (booking.booked_under, booking.wait) = (latest.epochs, r.wait);
            Ok(Ok(booking))
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
            let _waited = Waited {
                resource: &self.resource,
                since: tokio::time::Instant::now(),
                booked: self.wait,
            };
            tokio::time::sleep(Duration::from_micros(self.wait)).await;
        }
    }

    /// The booking is used: no refund on drop.
    pub(crate) fn consume(mut self) -> Self {
        self.armed = false;
        self
    }

    /// The cost is held by its caller now: no refund on drop; its key.
    pub(crate) fn claim(&mut self) -> Option<String> {
        self.armed = false;
        self.key.take()
    }

    /// Whether a shared store's failure policy answered the booking.
    pub(crate) fn answered_here(&self) -> bool {
        self.since == Some(Marks::ANSWERED_HERE)
    }

    /// Settles `usage` (`None`: the booked cost) on the latest limits; after a
    /// penalty since (`penalty_end`) the unused part stays spent.
    pub(crate) fn settle(
        &self,
        usage: Option<Cost>,
        penalty_end: Option<tokio::time::Instant>,
        op: &'static str,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (latest, cost) = (self.resource.latest(), self.cost);
        // The marks to settle with: kept if the limits did not change or a
        // failure policy answered; none when the buckets changed, so the
        // state may have been started afresh.
        let keep = latest.epochs.limits == self.booked_under.limits || self.answered_here();
        let change = if latest.epochs.buckets != self.booked_under.buckets {
            let actual = usage.unwrap_or(cost);
            (actual != NO_COST).then_some((NO_COST, actual, None))?
        } else {
            let mut actual = usage?;
            if penalty_end.is_some_and(|until| until > self.since_here) {
                actual.requests = actual.requests.max(cost.requests);
                actual.tokens = actual.tokens.max(cost.tokens);
            }
            (actual != cost).then_some((cost, actual, self.since.filter(|_| keep)))?
        };
        settle_or_spawn(
            &self.backend,
            &self.resource,
            self.key(),
            &latest.spec,
            change,
            op,
        )
    }
}

impl Drop for LiveBooking {
    /// Refunds an unused booking, unless a penalty put on since drained it.
    fn drop(&mut self) {
        if self.armed {
            let penalty_end = self.resource.penalties.until(self.key());
            let _ = self.settle(Some(NO_COST), penalty_end, "refund");
        }
    }
}

/// A settlement: the cost booked, the actual cost, and the booking's marks.
type Change = (Cost, Cost, Option<Marks>);

/// Settles `change` on `key` at once in process, else on a returned task of
/// its own; time given back wakes the head of the key's line.
fn settle_or_spawn(
    backend: &Arc<dyn Store>,
    resource: &Arc<Resource>,
    key: &str,
    spec: &Arc<LimitSpec>,
    (booked, actual, since): Change,
    op: &'static str,
) -> Option<tokio::task::JoinHandle<()>> {
    let gave_back = actual.requests < booked.requests || actual.tokens < booked.tokens;
    let settled = move |resource: &Resource, key: &str, r: Result<(), BackendError>| {
        if let Err(e) = r {
            note_backend_error(resource, op, &e);
        }
        if gave_back {
            resource.lines.gave_back(key);
        }
    };
    let local = backend.local();
    if let Some(r) = local.and_then(|l| l.settle_now(key, spec, booked, actual, since)) {
        settled(resource, key, r);
        return None;
    }
    let rt = tokio::runtime::Handle::try_current().ok()?;
    let (backend, resource) = (backend.clone(), resource.clone());
    let (key, spec) = (key.to_owned(), spec.clone());
    Some(rt.spawn(async move {
        let r = backend.settle(&key, &spec, booked, actual, since).await;
        settled(&resource, &key, r);
    }))
}

/// Counts the µs since `since` (the booked wait at most) as waited when
/// dropped.
struct Waited<'a> {
    resource: &'a Resource,
    since: tokio::time::Instant,
    booked: Micros,
}

impl Drop for Waited<'_> {
    fn drop(&mut self) {
        let waited = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        (self.resource).tally(|c| &c.wait_micros, waited.min(self.booked));
    }
}
