//! Queue + execute: `enqueue` reserves, sleeps to the booked time (and out
//! of a hold an upstream 429 set meanwhile), takes a concurrency slot, runs
//! the work and retries it by the resource's [`RetryPolicy`]. Cancellation-safe:
//! the guards here refund an unused reservation and free a held slot when
//! the future is dropped at any await point.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::in_flight::{to_its_answer, UntoldLease};
use super::{note_backend_error, Epochs, Latest, Permit, Resource, ResourceBroker, Target};
use crate::clock::Micros;
use crate::error::{BackendError, BrokerError};
use crate::limits::{Cost, Unit};
use crate::observed::ObservedLimit;
use crate::retry::{Outcome, OutcomeClass, RetryPolicy};
use crate::state::{LeaseId, LimitSpec, Marks};
use crate::stats::{add, bump, drop_one};
use crate::store::Store;
use crate::telemetry::{self, Signal};

/// Passed to the work on every attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// The cost reserved for this attempt.
    pub cost: Cost,
}

/// Why `enqueue` returned without a result.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError<E> {
    /// The broker refused before or between attempts (unknown resource,
    /// queue full, cost never fits, wait beyond the ceiling, backend down).
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The work failed with an error that no retry can fix. The work's
    /// error is the `source()` and ends the message.
    #[error("fatal upstream error on attempt {attempts}: {error}")]
    Fatal {
        /// The work's error.
        #[source]
        error: E,
        /// Attempts made.
        attempts: u32,
    },
    /// The retry budget ran out. The last attempt's error is the
    /// `source()` and ends the message.
    #[error("retry budget exhausted after {attempts} attempts (last outcome: {last:?}): {error}")]
    RetriesExhausted {
        /// The last attempt's error.
        #[source]
        error: E,
        /// Attempts made.
        attempts: u32,
        /// The class of the last outcome.
        last: OutcomeClass,
    },
}

pub(super) const NO_COST: Cost = Cost {
    requests: 0,
    tokens: 0,
};

/// A booked reservation. Dropped before [`Booking::consume`], it refunds
/// the cost, unless a hold put on since has drained it (see its `Drop`).
pub(crate) struct Booking {
    backend: Arc<dyn Store>,
    resource: Arc<Resource>,
    /// The epochs of the registration it was booked under: the latest
    /// then (see [`Resource::latest`]).
    booked_under: Epochs,
    key: String,
    cost: Cost,
    wait: Micros,
    /// The booking's marks on the store's clock
    /// ([`crate::state::Reservation::since`]).
    since: Marks,
    /// The same on this process's clock and holds: the time of the
    /// booking, or the end of the local hold it was made under if later.
    since_here: tokio::time::Instant,
    armed: bool,
}

impl Booking {
    /// Books `cost` within `max_wait`: `Ok(Ok(booking))`, or `Ok(Err(wait))`
    /// when the earliest time is beyond `max_wait` (nothing booked).
    pub(crate) async fn book(
        broker: &ResourceBroker,
        resource: &Arc<Resource>,
        key: String,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Result<Booking, Micros>, BrokerError> {
        let latest = resource.latest();
        let backend = broker.inner.backend.clone();
        let resource = resource.clone();
        // Run to its answer if the caller goes away meanwhile: a booking
        // the store makes then is dropped there, which refunds it.
        to_its_answer(async move {
            let r = backend
                .reserve(&key, &latest.spec, cost, max_wait)
                .await
                .inspect_err(|e| note_backend_error(&resource, "reserve", e))?;
            if !r.booked {
                return Ok(Err(r.wait));
            }
            let since_here = (resource.holds.until(&key)).unwrap_or_else(tokio::time::Instant::now);
            Ok(Ok(Booking {
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

    /// The reservation is used: no refund on drop. What a settlement of its
    /// cost needs.
    pub(crate) fn consume(mut self) -> Booked {
        self.armed = false;
        Booked {
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

/// A used reservation, for the settlement of its cost.
pub(crate) struct Booked {
    since: Marks,
    /// The booking's time on this process's clock and holds (see
    /// [`Booking`]).
    since_here: tokio::time::Instant,
    /// The epochs of the registration it was booked under.
    booked_under: Epochs,
}

impl Booked {
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
    /// `held_until` is this process's hold on the booking's state, if
    /// any: one put on after the booking (an upstream 429 since) keeps
    /// the unused part of the cost spent, as a cancelled booking's is
    /// (see `Booking`'s `Drop`): the store decides by its own holds, and
    /// this one covers a store that failed to take one. Usage above the
    /// estimate is charged whatever the hold.
    fn settlement(
        &self,
        resource: &Resource,
        cost: Cost,
        usage: Option<Cost>,
        held_until: Option<tokio::time::Instant>,
    ) -> Option<(Arc<LimitSpec>, Cost, Cost, Option<Marks>)> {
        match under(&resource.latest(), self.booked_under, self.since) {
            Under::Same(spec, since) => {
                let mut actual = usage?;
                if held_until.is_some_and(|until| until > self.since_here) {
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
/// [`Booking::refund_under`]).
pub(super) fn refund_spec(taken_under: &Resource) -> Option<Arc<LimitSpec>> {
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
pub(super) fn same_units(a: &LimitSpec, b: &LimitSpec) -> bool {
    a.buckets.len() == b.buckets.len()
        && (a.buckets.iter().zip(&b.buckets)).all(|((ua, _), (ub, _))| ua == ub)
}

impl Drop for Booking {
    fn drop(&mut self) {
        // After a hold put on since this booking (an upstream 429), giving
        // the cost back could return tokens the hold drained: the booking
        // stays spent instead. A booking made under a hold is given back.
        // The store decides by its own holds (`settle` with the booking's
        // mark); this process's holds cover a store that failed to take one.
        if !self.armed
            || self
                .resource
                .holds
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
    }
}

/// Settles `change` (reserved, actual, the booking's marks) on the state at
/// `key` under `spec`: at once when the store answers in process, else as
/// a task of its own, returned, so that no caller going away cuts the
/// correction off (`None`: made at once, or no runtime to run it). A
/// failure is logged as `op`.
pub(super) fn settle_or_spawn(
    backend: &Arc<dyn Store>,
    resource: &Arc<Resource>,
    key: &str,
    spec: &Arc<LimitSpec>,
    (reserved, actual, since): (Cost, Cost, Option<Marks>),
    op: &'static str,
) -> Option<tokio::task::JoinHandle<()>> {
    let local = backend.local();
    match local.and_then(|l| l.settle_now(key, spec, reserved, actual, since)) {
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
                let settled = backend.settle(&key, &spec, reserved, actual, since);
                if let Err(e) = settled.await {
                    note_backend_error(&resource, op, &e);
                }
            }))
        }
    }
}

pub(crate) enum SlotOutcome {
    Unlimited,
    /// The lease, and whether the slot was waited for (the first
    /// `hold_slot` found every slot held).
    Held(LeaseId, bool),
    TimedOut,
}

/// What one attempt of `enqueue` or `acquire` was given by
/// [`admit_until`].
pub(crate) enum Admitted {
    /// The booked cost, due now, and the slot (an empty permit without a
    /// concurrency limit).
    Go(Booking, Permit),
    /// The cost does not fit before the deadline (a wait or a hold beyond
    /// it): the wait, nothing booked.
    TooLong(Micros),
    /// No slot came free before the deadline.
    NoSlot,
}

/// Books `cost` on `key`, waits for its time, then for a slot, all before
/// `deadline`. A hold (an upstream 429 or an exhausted counter) that came
/// after the booking voids its time: the booking stays spent (its time has
/// come, as a sent call's would), and the cost is booked again when the
/// hold ends, so the calls the hold kept leave spaced as the bucket spaces
/// them, not together when it ends. A hold that came while the call waited
/// for its slot (the call that held the slot got a 429) voids it as well:
/// the slot is given back, and the call waits the hold out; so does the
/// store's hold of a 429 (or a spent counter) another process got while
/// the call waited for its slot or its booking's time. A booking
/// made under the hold it then meets (one the store did not make it wait out:
/// the store missed the penalty, or holds only a bucket this cost does not
/// draw on) is given back, as a cancelled one is (see `Booking`'s `Drop`):
/// the call is charged once, by the booking it makes when the hold ends.
///
/// The slot's permit is released on state `key` (`keyed`: a sub-key's
/// state, else the resource's own), and counted in flight if `counted`
/// (see [`Permit::held`]).
pub(crate) async fn admit_until(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    (key, keyed): (&str, bool),
    cost: Cost,
    deadline: tokio::time::Instant,
    counted: bool,
) -> Result<Admitted, BrokerError> {
    let backend = &broker.inner.backend;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let booking = match Booking::book(broker, resource, key.to_owned(), cost, left).await? {
            Ok(booking) => booking,
            Err(wait) => return Ok(Admitted::TooLong(wait)),
        };
        booking.sleep_until_due().await;
        let until = match resource.holds.until(key) {
            Some(until) => until,
            None => {
                let (permit, waited) = match wait_slot(broker, resource, key, deadline).await? {
                    SlotOutcome::Unlimited => (Permit::empty(), false),
                    SlotOutcome::Held(lease, waited) => {
                        let held_key = super::HeldKey::State(keyed.then(|| key.to_owned()));
                        let permit =
                            Permit::held(backend, resource.clone(), held_key, lease, counted);
                        (permit, waited)
                    }
                    SlotOutcome::TimedOut => return Ok(Admitted::NoSlot),
                };
                // A wait, for the booking's time or for the slot, is when
                // the store may have been held since the booking.
                let held = match resource.holds.until(key) {
                    None if waited || booking.wait > 0 => {
                        store_hold(broker, resource, key, cost).await?
                    }
                    held => held,
                };
                match held {
                    None => return Ok(Admitted::Go(booking, permit)),
                    Some(until) => {
                        drop(permit);
                        until
                    }
                }
            }
        };
        // Spent if the hold came after it, else given back (its `Drop`).
        drop(booking);
        if until > deadline {
            let now = tokio::time::Instant::now();
            return Ok(Admitted::TooLong(crate::clock::micros(until - now)));
        }
        tokio::time::sleep_until(until).await;
    }
}

/// How often a waiter re-checks a slot held by another process (local
/// releases wake waiters at once).
const SLOT_POLL: Duration = Duration::from_millis(25);

/// Waits for a concurrency slot until `deadline`.
pub(crate) async fn wait_slot(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    key: &str,
    deadline: tokio::time::Instant,
) -> Result<SlotOutcome, BrokerError> {
    let spec = &resource.latest().spec;
    if spec.max_concurrent.is_none() {
        return Ok(SlotOutcome::Unlimited);
    }
    let backend = &broker.inner.backend;
    let _waiting = resource.wait_for_slots();
    let mut waited = false;
    loop {
        let freed = resource.slot_notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        // A store that answers in process, in the caller's line; any other
        // through `hold_slot_later`.
        let held = match backend.local().and_then(|l| l.take_slot_now(key, spec)) {
            Some(held) => held.inspect_err(|e| note_backend_error(resource, "hold_slot", e))?,
            None => hold_slot_later(backend, resource, key, spec).await?,
        };
        if let Some(lease) = held {
            return Ok(SlotOutcome::Held(lease, waited));
        }
        waited = true;
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(SlotOutcome::TimedOut);
        }
        let until = deadline.min(now + SLOT_POLL);
        let _ = tokio::time::timeout_at(until, freed).await;
    }
}

/// The end of a hold the store has on state `key` for a call of `cost`,
/// if one is in force ([`Store::wait_left`]: a 429's penalty or a spent
/// counter another process reported, on the buckets the cost draws on, or
/// on a resource without rate limits the state's
/// [`crate::state::ResourceState::hold`]). Asked by a call that waited for
/// its booking's time or for its slot: a hold put on meanwhile (a 429 of
/// another process, or of the call that held the slot) would otherwise let
/// it go out during the penalty, as this process's own holds do not know
/// of it. A store that fails to answer holds nothing known on a resource
/// with rate limits: the store granted the booking, which goes ahead as
/// granted.
async fn store_hold(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    key: &str,
    cost: Cost,
) -> Result<Option<tokio::time::Instant>, BrokerError> {
    let spec = resource.latest().spec.clone();
    let wait = match broker.inner.backend.wait_left(key, &spec, cost).await {
        Ok(wait) => wait,
        Err(e) => {
            note_backend_error(resource, "wait_left", &e);
            if !spec.buckets.is_empty() {
                return Ok(None);
            }
            return Err(e.into());
        }
    };
    Ok((wait > 0).then(|| crate::clock::tokio_after(Duration::from_micros(wait))))
}

/// `hold_slot` on state `key` through the store's asynchronous call, run
/// to its answer if the caller goes away meanwhile (a timeout around
/// `acquire` or `enqueue` while the store is slow): a lease the store
/// grants then is released there, untold, not left held until it expires.
async fn hold_slot_later(
    backend: &Arc<dyn Store>,
    resource: &Arc<Resource>,
    key: &str,
    spec: &Arc<LimitSpec>,
) -> Result<Option<LeaseId>, BrokerError> {
    let (backend, resource) = (backend.clone(), resource.clone());
    let (key, spec) = (key.to_owned(), spec.clone());
    let held = to_its_answer(async move {
        let held = backend
            .take_slot(&key, &spec)
            .await
            .inspect_err(|e| note_backend_error(&resource, "hold_slot", e))?;
        let untold = held.map(|lease| UntoldLease::new(lease, backend, resource, key));
        Ok::<_, BackendError>(untold)
    });
    Ok(held.await?.map(UntoldLease::claim))
}

/// Counts an `enqueue` call as queued, then as running, and undoes the
/// count when dropped.
struct QueuePlace<'r> {
    resource: &'r Resource,
    running: bool,
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

impl<'r> QueuePlace<'r> {
    fn enter(resource: &'r Resource) -> Result<Self, BrokerError> {
        let capacity = resource.config.queue_capacity;
        // Counted for the resource id: the calls still waiting on a
        // registration this one replaced are in this resource's queue
        // too, so a re-registration does not make room for more.
        let queued = &resource.live.queued;
        if queued.fetch_add(1, Ordering::AcqRel) >= capacity as u64 {
            drop_one(queued);
            // A call refused at once still ended in an error.
            bump(&resource.counters.failed);
            return Err(BrokerError::QueueFull {
                resource: resource.id.clone(),
                capacity,
            });
        }
        Ok(Self {
            resource,
            running: false,
        })
    }

    fn set_running(&mut self, running: bool) {
        if self.running == running {
            return;
        }
        let (from, to) = if running {
            (&self.resource.live.queued, &self.resource.live.in_flight)
        } else {
            (&self.resource.live.in_flight, &self.resource.live.queued)
        };
        drop_one(from);
        bump(to);
        self.running = running;
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        let c = &self.resource.live;
        drop_one(if self.running {
            &c.in_flight
        } else {
            &c.queued
        });
    }
}

/// # Queue + execute
impl ResourceBroker {
    /// Waits for a slot on `target`, runs `work`, and retries it on 429 and
    /// transient failures by the resource's retry policy. Before every
    /// attempt the cost is reserved again (FIFO spacing, one backend call
    /// per attempt; an attempt that waited for its slot or its booked
    /// time asks the store once more, for the hold of a 429 another
    /// process got meanwhile). A 429 penalizes the bucket for every other
    /// consumer; `Outcome::Ok { usage, observed }` settles the actual cost
    /// and reconciles the upstream's headers.
    ///
    /// Dropping the returned future at any point refunds an unused
    /// reservation and frees a held concurrency slot.
    ///
    /// A resource registered with [`ResourceBroker::register_limit`] is
    /// queued too, with the queue capacity and retry policy of
    /// [`crate::ResourceConfig::new`]; [`ResourceBroker::register`]
    /// chooses them.
    ///
    /// ```
    /// use broker_core::{Cost, Outcome, ResourceBroker};
    /// # async fn demo(broker: ResourceBroker) {
    /// let answer: Result<String, _> = broker
    ///     .enqueue("openai", Cost::tokens(800), |attempt| async move {
    ///         // call the upstream here; report what happened
    ///         Outcome::<String, std::io::Error>::ok_with_usage("done".into(), Cost::tokens(650))
    ///     })
    ///     .await;
    /// # }
    /// ```
    pub async fn enqueue<'a, T, E, F, Fut>(
        &self,
        target: impl Into<Target<'a>>,
        cost: Cost,
        mut work: F,
    ) -> Result<T, EnqueueError<E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Outcome<T, E>>,
    {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        // A cost that never fits ends the call in an error, counted.
        resource
            .config
            .limits
            .check_fits(&resource.id, cost)
            .inspect_err(|_| bump(&resource.counters.failed))?;
        let key = match target.key {
            Some(k) => crate::keys::keyed(&resource.id, k),
            None => resource.key.clone(),
        };
        let mut place = QueuePlace::enter(&resource)?;
        let policy: &RetryPolicy = &resource.config.retry;
        let limits = resource.config.paced_limits();
        // One ceiling bounds the wait for a slot and every retry pause.
        let ceiling = policy.ceiling(&limits);
        let mut number = 0;
        let result = loop {
            number += 1;
            // One ceiling bounds the waits of an attempt: its booked time, a
            // hold, a slot.
            let deadline = crate::clock::tokio_after(ceiling);
            // The slot is not counted in flight: the queue place counts
            // this work.
            let state = (key.as_str(), target.key.is_some());
            let admitted = admit_until(self, &resource, state, cost, deadline, false);
            let (booking, permit) = match admitted.await {
                Ok(Admitted::Go(booking, permit)) => (booking, permit),
                Ok(Admitted::TooLong(wait)) => {
                    break Err(EnqueueError::Broker(BrokerError::WaitTooLong {
                        resource: resource.id.clone(),
                        wait: Duration::from_micros(wait),
                        ceiling,
                    }))
                }
                Ok(Admitted::NoSlot) => {
                    break Err(EnqueueError::Broker(BrokerError::WaitTooLong {
                        resource: resource.id.clone(),
                        wait: ceiling,
                        ceiling,
                    }))
                }
                // A backend error ends the call as a failed one, counted below.
                Err(e) => break Err(EnqueueError::Broker(e)),
            };
            let booked = booking.consume();
            bump(&resource.tally().counters.allowed);
            place.set_running(true);
            let outcome = work(Attempt { number, cost }).await;
            let class = outcome.class();
            let retry_after = outcome.retry_after();
            // This process's hold on the state before the answer's own
            // holds: what the settlement of a success goes by.
            let held_until = resource.holds.until(&key);
            // A 429's hold, and that of a counter the answer reports spent,
            // go on before the slot is freed: a call waiting for the slot
            // would otherwise take it, find no hold yet, and go out during
            // the penalty or into the spent window (the settlement and the
            // penalty before the reconcile are round trips to the store).
            let hold = matches!(outcome, Outcome::RateLimited { .. }).then(|| {
                let hold = policy.rate_limited_pause(number, retry_after, &limits);
                resource.holds.hold(&key, crate::clock::tokio_after(hold));
                hold
            });
            if let Some(observed) = outcome.observed() {
                hold_spent_counters(&resource, &key, &capped_resets(&resource, observed));
            }
            // What the answer tells the store (a 429's penalty, the
            // settlement of a success, the counters it reports) reaches
            // the store before a slot is freed: a call of another process
            // that waited for the slot asks the store for a hold once it
            // has the slot (see `admit_until`; a resource without rate
            // limits is held by the store's state alone,
            // `ResourceState::hold`), and would otherwise find none yet,
            // and go out during the penalty or into the spent window. The
            // settlement goes before the reconcile, which corrects the
            // state it leaves. Run to its end, the slot freed after it,
            // even if this call is dropped meanwhile (a timeout around
            // `enqueue`): dropped with the call, the slot would be freed
            // before the store holds the state, and the penalty or the
            // spent counter's hold lost.
            let settlement = match &outcome {
                Outcome::Ok { usage, .. } => booked.settlement(&resource, cost, *usage, held_until),
                _ => None,
            };
            let observed = outcome.observed().cloned();
            if hold.is_some() || settlement.is_some() || observed.is_some() {
                let (broker, resource, key) = (self.clone(), resource.clone(), key.clone());
                to_its_answer(async move {
                    if let Some(hold) = hold {
                        broker
                            .note_upstream_429(&resource, &key, number, retry_after, hold)
                            .await;
                    }
                    if let Some((spec, reserved, actual, since)) = settlement {
                        // A failed correction is logged, not returned.
                        let change = (reserved, actual, since);
                        let backend = &broker.inner.backend;
                        if let Some(task) =
                            settle_or_spawn(backend, &resource, &key, &spec, change, "settle")
                        {
                            let _ = task.await;
                        }
                    }
                    if let Some(observed) = observed {
                        // Likewise: a failed reconcile never fails the answer.
                        let _ = broker.reconcile_key(&resource, &key, &observed).await;
                    }
                    drop(permit);
                })
                .await;
            } else {
                drop(permit);
            }
            place.set_running(false);
            let error = match outcome {
                Outcome::Ok { value, .. } => break Ok(value),
                Outcome::RateLimited { error, .. }
                | Outcome::Transient { error, .. }
                | Outcome::Fatal { error, .. } => error,
            };
            if !class.is_retryable() {
                break Err(EnqueueError::Fatal {
                    error,
                    attempts: number,
                });
            }
            let Some(pause) = policy.pause(class, number, retry_after, &limits) else {
                break Err(exhausted(&resource, error, number, class));
            };
            bump(&resource.tally().counters.retries);
            tokio::time::sleep(pause).await;
        };
        let tally = resource.tally();
        bump(if result.is_ok() {
            &tally.counters.completed
        } else {
            &tally.counters.failed
        });
        result
    }

    /// After a real upstream 429: count it, log it, and penalize the bucket
    /// for `hold` (protects every other consumer of it); this process's own
    /// hold is on already, put on before the call's slot was freed (on a
    /// resource without rate limits, so is this penalty: see the call).
    /// Runs on the last attempt too, so the next run does not start into
    /// the closed window.
    /// A failed penalize is logged; the 429 stays the caller's outcome.
    async fn note_upstream_429(
        &self,
        resource: &Arc<Resource>,
        key: &str,
        attempt: u32,
        retry_after: Option<Duration>,
        hold: Duration,
    ) {
        bump(&resource.tally().counters.upstream_429);
        telemetry::count(&resource.id, Signal::Upstream429);
        tracing::info!(
            resource = %resource.id,
            attempt,
            retry_after_ms = retry_after.map(|d| d.as_millis() as u64),
            hold_ms = hold.as_millis() as u64,
            "upstream 429"
        );
        let (backend, resource) = (self.inner.backend.clone(), resource.clone());
        let (key, spec) = (key.to_owned(), resource.latest().spec.clone());
        // Run to its end even if this call is dropped meanwhile (a timeout
        // around `enqueue`): cut off, the penalty would leave the other
        // replicas sending into the upstream's refusal.
        to_its_answer(async move {
            if let Err(e) = backend.penalize(&key, &spec, hold).await {
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
        // No bucket for a counter to narrow: a spent one holds the state
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
        hold_spent_counters(resource, key, observed);
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
/// one ceiling bounds a hold for a spent counter as it bounds a
/// `Retry-After`, so a reset of hours does not fail the next attempt's
/// wait on our side.
fn capped_resets(resource: &Resource, observed: &ObservedLimit) -> ObservedLimit {
    let ceiling = resource
        .config
        .retry
        .ceiling(&resource.config.paced_limits());
    cap_resets(observed, ceiling)
}

/// Holds `key` in this process until the reset of every counter of
/// `capped` (`observed` as [`capped_resets`] gives it) that is spent
/// (`remaining == 0`) and has a bucket of its unit in the resource's
/// latest limits, so that what is booked here already waits as the
/// store's `reconcile` makes new bookings wait (see `state::reconcile`).
/// A resource without rate limits is held until the latest reset of any
/// spent counter, as the store holds it (see `reconcile_key`).
fn hold_spent_counters(resource: &Arc<Resource>, key: &str, capped: &ObservedLimit) {
    let buckets = &resource.latest().spec.buckets;
    if buckets.is_empty() {
        if let Some(reset) = spent_reset(capped) {
            resource.holds.hold(key, crate::clock::tokio_after(reset));
        }
        return;
    }
    for (unit, _) in buckets {
        if let Some(o) = capped.of(*unit).filter(|o| o.remaining == Some(0)) {
            if let Some(reset) = o.reset {
                resource.holds.hold(key, crate::clock::tokio_after(reset));
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

impl<E> EnqueueError<E> {
    /// The class of this error, by the same rule as the work's outcomes:
    /// a fatal upstream error or a call that can never succeed (unknown
    /// resource, cost beyond the burst, bad config) is [`OutcomeClass::Fatal`];
    /// an exhausted budget keeps the class of its last outcome; a full queue
    /// or a wait beyond the ceiling is [`OutcomeClass::RateLimited`]; a
    /// backend failure is [`OutcomeClass::Transient`].
    pub fn class(&self) -> OutcomeClass {
        match self {
            EnqueueError::Fatal { .. } => OutcomeClass::Fatal,
            EnqueueError::RetriesExhausted { last, .. } => *last,
            EnqueueError::Broker(b) => match b {
                BrokerError::QueueFull { .. } | BrokerError::WaitTooLong { .. } => {
                    OutcomeClass::RateLimited
                }
                BrokerError::Backend(_) => OutcomeClass::Transient,
                BrokerError::UnknownResource(_)
                | BrokerError::CostNeverFits { .. }
                | BrokerError::Config(_) => OutcomeClass::Fatal,
            },
        }
    }

    /// Whether a later run of the whole job may succeed (the one rule,
    /// [`OutcomeClass::is_retryable`], applied to this error's class): a job
    /// queue should fail the job at once when this is false.
    pub fn is_retryable(&self) -> bool {
        self.class().is_retryable()
    }
}

fn exhausted<E>(
    resource: &Resource,
    error: E,
    attempts: u32,
    last: OutcomeClass,
) -> EnqueueError<E> {
    bump(&resource.tally().counters.retries_exhausted);
    telemetry::count(&resource.id, Signal::RetriesExhausted);
    tracing::warn!(resource = %resource.id, attempts, ?last, "retry budget exhausted");
    EnqueueError::RetriesExhausted {
        error,
        attempts,
        last,
    }
}
