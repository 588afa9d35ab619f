//! Bookings made in the store: refunded when dropped
//! unused, and settled after the work.

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

/// A booking made in the store. Dropped before [`LiveBooking::consume`], it refunds
/// the cost, unless a penalty put on since has drained it (see its `Drop`).
pub(crate) struct LiveBooking {
    backend: Arc<dyn Store>,
    resource: Arc<Resource>,
    /// The epochs of the registration it was booked under: the latest
    /// then (see [`Resource::latest`]).
    booked_under: Epochs,
    key: String,
    cost: Cost,
    pub(super) wait: Micros,
    /// The booking's marks on the store's clock
    /// ([`crate::state::Booking::since`]).
    since: Marks,
    /// The same on this process's clock and penalties: the time of the
    /// booking, or the end of the local penalty it was made under if later.
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
        // Run to its answer if the caller goes away meanwhile: a booking
        // the store makes then is dropped there, which refunds it.
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

    /// Sleeps until the booked time, counting it as a local limiter wait:
    /// the time it waited, also when the call is dropped before the end.
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

    /// The booking is used: no refund on drop. What a settlement of its
    /// cost needs.
    pub(crate) fn consume(mut self) -> UsedBooking {
        self.armed = false;
        UsedBooking {
            since: self.since,
            since_here: self.since_here,
            booked_under: self.booked_under,
        }
    }

    /// The limits to refund under, or `None` when no refund is due: the
    /// booking's state was started afresh by a registration with other
    /// buckets, so holds none of its cost.
    fn refund_under(&self) -> Option<(Arc<LimitSpec>, Option<Marks>)> {
        match under(&self.resource.latest(), self.booked_under, self.since) {
            Under::Same(spec, since) => Some((spec, since)),
            Under::Afresh(_) => None,
        }
    }
}

/// A used booking, for the settlement of its cost.
pub(crate) struct UsedBooking {
    since: Marks,
    /// The booking's time on this process's clock and penalties (see
    /// [`LiveBooking`]).
    since_here: tokio::time::Instant,
    /// The epochs of the registration it was booked under.
    booked_under: Epochs,
}

impl UsedBooking {
    /// Whether a shared store's failure policy answered the booking while
    /// the store was out of reach (see [`Marks::ANSWERED_HERE`]).
    pub(crate) fn answered_here(&self) -> bool {
        self.since == Marks::ANSWERED_HERE
    }

    /// How the work's `usage` (`None`: the booked `cost`) settles on the
    /// latest limits of `resource` (the registration booked on, or one it
    /// replaced): the settlement of the booking, or, when the
    /// booking's state may have been started afresh since by a
    /// registration with other buckets (so holds none of it), a charge of
    /// the whole usage. `None` when there is nothing to settle.
    ///
    /// `penalty_end` is this process's penalty on the booking's state, if
    /// any: one put on after the booking (an upstream 429 since) keeps
    /// the unused part of the cost spent, as a cancelled booking's is
    /// (see `LiveBooking`'s `Drop`): the store decides by its own penalties, and
    /// this one covers a store that failed to take one. Usage above the
    /// estimate is charged whatever the penalty.
    pub(super) fn settlement(
        &self,
        resource: &Resource,
        cost: Cost,
        usage: Option<Cost>,
        penalty_end: Option<tokio::time::Instant>,
    ) -> Option<(Arc<LimitSpec>, Cost, Cost, Option<Marks>)> {
        match under(&resource.latest(), self.booked_under, self.since) {
            Under::Same(spec, since) => {
                let mut actual = usage?;
                if penalty_end.is_some_and(|until| until > self.since_here) {
                    actual.requests = actual.requests.max(cost.requests);
                    actual.tokens = actual.tokens.max(cost.tokens);
                }
                (actual != cost).then_some((spec, cost, actual, since))
            }
            Under::Afresh(spec) => Some((spec, NO_COST, usage.unwrap_or(cost), None)),
        }
    }
}

/// What a booking's state is now, against the limits it was booked under.
enum Under {
    /// Every registration since kept the buckets it was booked in (the
    /// same units in the same order: a store starts a state afresh only
    /// for another number of buckets, and keeps buckets by place): the
    /// latest limits, with its marks if no registration since changed the
    /// limits (marks name the buckets of the limits they were made under),
    /// or if a failure policy answered it (see [`Marks::ANSWERED_HERE`]).
    Same(Arc<LimitSpec>, Option<Marks>),
    /// A registration since had other buckets: the state may have been
    /// started afresh. The latest limits.
    Afresh(Arc<LimitSpec>),
}

/// [`Under`] for a booking made under a registration of epochs
/// `booked_under` with marks `since`, now that `latest` is the latest
/// registration (see [`Epochs`]).
fn under(latest: &Latest, booked_under: Epochs, since: Marks) -> Under {
    let spec = latest.spec.clone();
    if latest.epochs.buckets != booked_under.buckets {
        return Under::Afresh(spec);
    }
    let same_limits = latest.epochs.limits == booked_under.limits;
    let keep = same_limits || since == Marks::ANSWERED_HERE;
    Under::Same(spec, keep.then_some(since))
}

/// The limits to give back a cost taken, without a booking's marks, under
/// registration `taken_under` (see [`Under`]): the latest, or `None` when a
/// registration since had other buckets (the state may have been started
/// afresh, and holds none of it; a refund under the limits it was taken
/// under would start it afresh again, as a cancelled booking's would: see
/// [`LiveBooking::refund_under`]).
pub(crate) fn refund_spec(taken_under: &Resource) -> Option<Arc<LimitSpec>> {
    match under(
        &taken_under.latest(),
        taken_under.epochs,
        Marks::ANSWERED_HERE,
    ) {
        Under::Same(spec, _) => Some(spec),
        Under::Afresh(_) => None,
    }
}

/// Whether `a` and `b` have buckets of the same units in the same order.
pub(crate) fn same_units(a: &LimitSpec, b: &LimitSpec) -> bool {
    a.buckets.len() == b.buckets.len()
        && (a.buckets.iter().zip(&b.buckets)).all(|((ua, _), (ub, _))| ua == ub)
}

impl Drop for LiveBooking {
    fn drop(&mut self) {
        // After a penalty put on since this booking (an upstream 429), giving
        // the cost back could return tokens the penalty drained: the booking
        // stays spent instead. A booking made under a penalty is given back.
        // The store decides by its own penalties (`settle` with the booking's
        // mark); this process's penalties cover a store that failed to take one.
        if !self.armed
            || self
                .resource
                .penalties
                .until(&self.key)
                .is_some_and(|until| until > self.since_here)
        {
            return;
        }
        let Some((spec, since)) = self.refund_under() else {
            return;
        };
        let change = (self.cost, NO_COST, since);
        // Dropped: nothing waits for the task.
        let _ = settle_or_spawn(
            &self.backend,
            &self.resource,
            &self.key,
            &spec,
            change,
            "refund",
        );
        // The time given back may be the head's of this state's line.
        self.resource.lines.gave_back(&self.key);
    }
}

/// Settles `change` (booked, actual, the booking's marks) on the state at
/// `key` under `spec`: at once when the store answers in process, else as
/// a task of its own, returned, so that no caller going away cuts the
/// correction off (`None`: made at once, or no runtime to run it). A
/// failure is logged as `op`.
pub(crate) fn settle_or_spawn(
    backend: &Arc<dyn Store>,
    resource: &Arc<Resource>,
    key: &str,
    spec: &Arc<LimitSpec>,
    (booked, actual, since): (Cost, Cost, Option<Marks>),
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

/// Adds the time since `since` (the booked wait at most) to `total`, in
/// µs, when dropped: at the end of a wait, or when its call is dropped
/// during it.
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
