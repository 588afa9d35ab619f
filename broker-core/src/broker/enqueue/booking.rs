//! Bookings made in the store: refunded when dropped unused, and settled
//! after the work.

use std::sync::Arc;
use std::time::Duration;

use crate::broker::in_flight::to_its_answer;
use crate::broker::{note_backend_error, Epochs, Latest, Resource, ResourceBroker};
use crate::clock::Micros;
use crate::error::BrokerError;
use crate::limits::Cost;
use crate::state::{LimitSpec, Marks};
use crate::stats::{add, bump};
use crate::store::Store;
use crate::telemetry::{self, Signal};

pub(crate) const NO_COST: Cost = Cost {
    requests: 0,
    tokens: 0,
};

/// A booking made in the store. Dropped before [`LiveBooking::consume`],
/// it refunds the cost, unless a penalty put on since has drained it.
pub(crate) struct LiveBooking {
    backend: Arc<dyn Store>,
    resource: Arc<Resource>,
    /// The epochs of the latest registration when it was booked.
    booked_under: Epochs,
    key: String,
    cost: Cost,
    pub(super) wait: Micros,
    /// The booking's marks on the store's clock.
    since: Marks,
    /// The same here: the time of the booking, or the end of the local
    /// penalty it was made under if later.
    since_here: tokio::time::Instant,
    armed: bool,
}

impl LiveBooking {
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
            let since_here =
                (resource.penalties.until(&key)).unwrap_or_else(tokio::time::Instant::now);
            Ok(Ok(LiveBooking {
                backend,
                resource,
                booked_under: latest.epochs,
                key,
                cost,
                wait: r.wait,
                since: r.since,
                since_here,
                armed: true,
            }))
        })
        .await
    }

    /// Sleeps until the booked time, counted as a local limiter wait (also
    /// when the call is dropped before the end).
    pub(crate) async fn sleep_until_due(&self) {
        if self.wait > 0 {
            let tally = self.resource.tally();
            bump(&tally.counters.waits);
            telemetry::count(&self.resource.id, Signal::LocalWait);
            let _waited = Waited {
                total: &tally.counters.wait_micros,
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

    /// Whether a shared store's failure policy answered the booking.
    pub(crate) fn answered_here(&self) -> bool {
        self.since == Marks::ANSWERED_HERE
    }

    /// How the work's `usage` (`None`: the booked cost) settles on the
    /// latest limits: a correction of the booking, or a charge of the whole
    /// usage when a registration since had other buckets; `None`: nothing
    /// to settle. After a penalty put on since the booking (`penalty_end`)
    /// the unused part stays spent; usage above the cost is charged anyway.
    pub(super) fn settlement(
        &self,
        usage: Option<Cost>,
        penalty_end: Option<tokio::time::Instant>,
    ) -> Option<(Arc<LimitSpec>, Change)> {
        let (latest, cost) = (self.resource.latest(), self.cost);
        let Some(since) = marks_under(&latest, self.booked_under, self.since) else {
            let actual = usage.unwrap_or(cost);
            return (actual != NO_COST).then(|| (latest.spec.clone(), (NO_COST, actual, None)));
        };
        let mut actual = usage?;
        if penalty_end.is_some_and(|until| until > self.since_here) {
            actual.requests = actual.requests.max(cost.requests);
            actual.tokens = actual.tokens.max(cost.tokens);
        }
        (actual != cost).then(|| (latest.spec.clone(), (cost, actual, since)))
    }
}

/// The marks to settle a booking of epochs `booked_under` and marks `since`
/// with on the latest limits (kept if the limits did not change or a
/// failure policy answered); `None` when a registration since had other
/// buckets, so the state may have been started afresh.
fn marks_under(latest: &Latest, booked_under: Epochs, since: Marks) -> Option<Option<Marks>> {
    let keep = latest.epochs.limits == booked_under.limits || since == Marks::ANSWERED_HERE;
    (latest.epochs.buckets == booked_under.buckets).then_some(keep.then_some(since))
}

/// The limits to give back a cost taken under `taken_under`: the latest,
/// or `None` when a registration since had other buckets.
pub(crate) fn refund_spec(taken_under: &Resource) -> Option<Arc<LimitSpec>> {
    let latest = taken_under.latest();
    marks_under(&latest, taken_under.epochs, Marks::ANSWERED_HERE).map(|_| latest.spec.clone())
}

/// Whether `a` and `b` have buckets of the same units in the same order.
pub(crate) fn same_units(a: &LimitSpec, b: &LimitSpec) -> bool {
    a.buckets.len() == b.buckets.len()
        && (a.buckets.iter().zip(&b.buckets)).all(|((ua, _), (ub, _))| ua == ub)
}

impl Drop for LiveBooking {
    /// Refunds an unused booking, unless a penalty put on since drained it.
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let penalty_end = self.resource.penalties.until(&self.key);
        let Some((spec, change)) = self.settlement(Some(NO_COST), penalty_end) else {
            return;
        };
        let (backend, resource) = (&self.backend, &self.resource);
        let _ = settle_or_spawn(backend, resource, &self.key, &spec, change, "refund");
        resource.lines.gave_back(&self.key);
    }
}

/// A settlement: the cost booked, the actual cost, and the booking's marks.
pub(crate) type Change = (Cost, Cost, Option<Marks>);

/// Settles `change` (booked, actual, marks) on state `key`: at once when
/// the store answers in process, else on a task of its own, returned (no
/// caller going away cuts it off). A failure is logged as `op`.
pub(crate) fn settle_or_spawn(
    backend: &Arc<dyn Store>,
    resource: &Arc<Resource>,
    key: &str,
    spec: &Arc<LimitSpec>,
    (booked, actual, since): Change,
    op: &'static str,
) -> Option<tokio::task::JoinHandle<()>> {
    let local = backend.local();
    match local.and_then(|l| l.settle_now(key, spec, booked, actual, since)) {
        Some(Ok(())) => None,
        Some(Err(e)) => {
            note_backend_error(resource, op, &e);
            None
        }
        None => {
            let rt = tokio::runtime::Handle::try_current().ok()?;
            let (backend, resource) = (backend.clone(), resource.clone());
            let (key, spec) = (key.to_owned(), spec.clone());
            Some(rt.spawn(async move {
                let settled = backend.settle(&key, &spec, booked, actual, since);
                if let Err(e) = settled.await {
                    note_backend_error(&resource, op, &e);
                }
            }))
        }
    }
}

/// Adds the µs since `since` (the booked wait at most) to `total` when
/// dropped.
struct Waited<'a> {
    total: &'a std::sync::atomic::AtomicU64,
    since: tokio::time::Instant,
    booked: Micros,
}

impl Drop for Waited<'_> {
    fn drop(&mut self) {
        let waited = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        add(self.total, waited.min(self.booked));
    }
}
