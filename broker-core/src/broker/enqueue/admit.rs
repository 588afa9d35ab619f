//! One attempt's admission: its booking, its booked time, penalties, and
//! a concurrency slot.

use std::sync::Arc;
use std::time::Duration;

use super::booking::LiveBooking;
use crate::broker::in_flight::to_its_answer;
use crate::broker::queue::{self, Ticket};
use crate::broker::{note_backend_error, HeldKey, Permit, Resource, ResourceBroker};
use crate::clock::Micros;
use crate::error::{BackendError, BrokerError, WaitBound};
use crate::limits::Cost;
use crate::store::{Turn, TurnAsk};

/// What [`admit_until`] gave one attempt of `enqueue` or `acquire`.
pub(crate) enum Admitted {
    /// The booked cost, due now, and the slot (if limited).
    Go(LiveBooking, Permit),
    /// A wait or a penalty beyond a bound: the wait ahead, nothing booked.
    TooLong(Micros, WaitBound),
    /// No slot came free before the deadline.
    NoSlot(WaitBound),
}

/// What bounds the waits of a call in [`admit_until`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The call's deadline, and its length as the caller gave it.
    pub(crate) deadline: Option<(tokio::time::Instant, Duration)>,
    /// The longest penalty (a 429's, a spent counter's) the call waits out.
    pub(crate) ceiling: Option<Duration>,
}

impl Bounds {
    /// The time left before the deadline (`Duration::MAX` without one).
    fn left(&self) -> Duration {
        self.deadline.map_or(Duration::MAX, |(at, _)| {
            at.saturating_duration_since(tokio::time::Instant::now())
        })
    }

    /// The deadline, or the far future.
    fn until(&self) -> tokio::time::Instant {
        self.deadline
            .map_or_else(|| crate::clock::tokio_after(Duration::MAX), |(at, _)| at)
    }

    /// The deadline as a bound (zero without one).
    fn deadline_bound(&self) -> WaitBound {
        WaitBound::Deadline(self.deadline.map_or(Duration::ZERO, |(_, d)| d))
    }

    /// The refusal of a penalty ending at `until` that meets a bound, if
    /// it does.
    fn penalty_beyond(&self, until: tokio::time::Instant) -> Option<Admitted> {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let bound = match (self.ceiling, self.deadline) {
            (Some(c), _) if left > c => WaitBound::PenaltyCeiling(c),
            (_, Some((at, d))) if until > at => WaitBound::Deadline(d),
            _ => return None,
        };
        Some(Admitted::TooLong(crate::clock::micros(left), bound))
    }
}

/// Books `cost` on `key`, waits for its time, then for a slot, within
/// `bounds`. A penalty that came after the booking (a 429, a spent
/// counter, here or, after a wait, in the store) voids it: the slot is
/// given back, the booking stays spent (or is refunded if made under that
/// penalty, see `LiveBooking`'s `Drop`), and the cost is booked again when
/// the penalty ends, so the calls it kept leave spaced. The permit is
/// released on state `key` (`keyed`: a sub-key's) and counted in flight
/// if `counted`.
pub(crate) async fn admit_until(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    (key, keyed): (&str, bool),
    cost: Cost,
    bounds: &Bounds,
    mut ticket: Option<&mut Ticket>,
    counted: bool,
) -> Result<Admitted, BrokerError> {
    loop {
        let booked = match ticket.as_deref_mut() {
            Some(ticket) => {
                let booked = book_in_line(broker, resource, key, cost, bounds, ticket).await;
                ticket.leave();
                booked?
            }
            None => LiveBooking::book(broker, resource, key.to_owned(), cost, bounds.left())
                .await?
                .map_err(|wait| Admitted::TooLong(wait, bounds.deadline_bound())),
        };
        let booking = match booked {
            Ok(booking) => booking,
            Err(too_long) => return Ok(too_long),
        };
        booking.sleep_until_due().await;
        let until = match resource.penalties.until(key) {
            Some(until) => until,
            None => {
                let slot = wait_slot(broker, resource, (key, keyed), counted, bounds.until());
                let Some((permit, waited)) = slot.await? else {
                    return Ok(Admitted::NoSlot(bounds.deadline_bound()));
                };
                // After a wait the store may have a penalty since.
                let held = match resource.penalties.until(key) {
                    None if waited || booking.wait > 0 => {
                        store_penalty(broker, resource, key, cost).await?
                    }
                    held => held,
                };
                let Some(until) = held else {
                    return Ok(Admitted::Go(booking, permit));
                };
                until
            }
        };
        drop(booking);
        if let Some(too_long) = bounds.penalty_beyond(until) {
            return Ok(too_long);
        }
        tokio::time::sleep_until(until).await;
    }
}

/// Books `cost` on `key` through the call's place in its line: waits for
/// its turn, then, as head, books at most its priority's horizon ahead
/// ([`queue::horizon`]), napping until the time comes within it. `Err`: a
/// bound met, nothing booked. The caller leaves the line after it.
async fn book_in_line(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    key: &str,
    cost: Cost,
    bounds: &Bounds,
    ticket: &mut Ticket,
) -> Result<Result<LiveBooking, Admitted>, BrokerError> {
    ticket.join();
    // The shared ledger charged this booking's flow.
    let mut charged = false;
    let behind =
        |t: &Ticket| Admitted::TooLong(crate::clock::micros(t.ahead()), bounds.deadline_bound());
    loop {
        if let Some((at, _)) = bounds.deadline {
            if tokio::time::timeout_at(at, ticket.turn()).await.is_err() {
                return Ok(Err(behind(ticket)));
            }
        } else {
            ticket.turn().await;
        }
        let spec = resource.latest().spec.clone();
        let horizon = queue::horizon(ticket.priority(), &spec, ticket.units());
        let left = bounds.left();
        if !charged && horizon.is_some() {
            if shared_turn(broker, resource, key, ticket).await == Turn::NotYet {
                if left.is_zero() {
                    return Ok(Err(behind(ticket)));
                }
                ticket
                    .nap(Duration::from_micros(ticket.units()).min(left))
                    .await;
                continue;
            }
            charged = true;
        }
        let max_wait = horizon.unwrap_or(Duration::MAX).min(left);
        let booked = LiveBooking::book(broker, resource, key.to_owned(), cost, max_wait).await?;
        let wait = match booked {
            Ok(booking) => return Ok(Ok(booking)),
            Err(wait) => Duration::from_micros(wait),
        };
        if wait > left {
            let bound = bounds.deadline_bound();
            return Ok(Err(Admitted::TooLong(crate::clock::micros(wait), bound)));
        }
        // A wait beyond the penalty ceiling may be a penalty beyond it.
        if bounds.ceiling.is_some_and(|c| wait > c) {
            let held = match resource.penalties.until(key) {
                Some(until) => Some(until),
                None => store_penalty(broker, resource, key, cost).await?,
            };
            let beyond = held.and_then(|until| bounds.penalty_beyond(until));
            if let Some(too_long @ Admitted::TooLong(_, WaitBound::PenaltyCeiling(_))) = beyond {
                return Ok(Err(too_long));
            }
        }
        ticket.set_due(crate::clock::tokio_after(wait));
        let nap = wait.saturating_sub(horizon.unwrap_or(Duration::ZERO));
        ticket.nap(nap.max(Duration::from_micros(1))).await;
    }
}

/// The least time a flow stays in the shared turn ledger after its last ask.
const ACTIVE_AT_LEAST: Duration = Duration::from_secs(1);

/// Whether the store's shared turn ledger gives the head `ticket`'s flow
/// the turn on `key` (charging it). No flow, no ledger, or no answer: yes.
async fn shared_turn(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    key: &str,
    ticket: &Ticket,
) -> Turn {
    let (flow, weight) = ticket.flow();
    let Some(turns) = broker.inner.backend.turns().filter(|_| !flow.is_empty()) else {
        return Turn::Yours;
    };
    let interval = Duration::from_micros(ticket.units());
    let ask = TurnAsk {
        level: ticket.priority().index() as u8,
        flow,
        weight,
        units: ticket.units(),
        last: !ticket.flow_queued(),
        active: interval.saturating_mul(4).max(ACTIVE_AT_LEAST),
    };
    turns.turn(key, &ask).await.unwrap_or_else(|e| {
        tracing::debug!(resource = %resource.id, error = %e, "turn ledger unanswered: local order alone");
        Turn::Yours
    })
}

/// How often a waiter re-checks a slot held by another process.
const SLOT_POLL: Duration = Duration::from_millis(25);

/// Waits for a concurrency slot on state `key` until `deadline`: its
/// permit (empty without a concurrency limit, released as `admit_until`'s)
/// and whether it was waited for; `None` when none came free in time.
async fn wait_slot(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    (key, keyed): (&str, bool),
    counted: bool,
    deadline: tokio::time::Instant,
) -> Result<Option<(Permit, bool)>, BrokerError> {
    let spec = &resource.latest().spec;
    if spec.max_concurrent.is_none() {
        return Ok(Some((Permit::empty(), false)));
    }
    let backend = &broker.inner.backend;
    let mut waited = false;
    loop {
        let freed = resource.slot_notify.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let permit = |lease| {
            let held_key = HeldKey::State(keyed.then(|| key.to_owned()));
            Permit::held(backend, resource.clone(), held_key, lease, counted)
        };
        let held =
            match backend.local().and_then(|l| l.take_slot_now(key, spec)) {
                Some(held) => held
                    .inspect_err(|e| note_backend_error(resource, "take_slot", e))?
                    .map(permit),
                // Run to its answer if the caller goes away: the permit of a
                // lease granted then is dropped there, released.
                None => {
                    let (backend, resource) = (backend.clone(), resource.clone());
                    let (owned, spec) = (key.to_owned(), spec.clone());
                    to_its_answer(async move {
                        let lease = (backend.take_slot(&owned, &spec).await)
                            .inspect_err(|e| note_backend_error(&resource, "take_slot", e))?;
                        let held_key = HeldKey::State(keyed.then_some(owned));
                        Ok::<_, BackendError>(lease.map(|lease| {
                            Permit::held(&backend, resource, held_key, lease, counted)
                        }))
                    })
                    .await?
                }
            };
        if let Some(permit) = held {
            return Ok(Some((permit, waited)));
        }
        waited = true;
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let until = deadline.min(now + SLOT_POLL);
        let _ = tokio::time::timeout_at(until, freed).await;
    }
}

/// The end of a penalty the store has on state `key` for `cost`, if one
/// is in force ([`Store::wait_left`]): one of another process this one
/// does not know of. A store that fails to answer reports none on a
/// resource with rate limits (the booking it granted stands).
async fn store_penalty(
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
