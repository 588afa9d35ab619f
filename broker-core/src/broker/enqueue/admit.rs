//! One attempt's admission: its booking (through the call's place in the
//! line of its state), its booked time, holds, and a concurrency slot.

use std::sync::Arc;
use std::time::Duration;

use super::booking::LiveBooking;
use crate::broker::in_flight::{to_its_answer, UntoldLease};
use crate::broker::queue::{self, Ticket};
use crate::broker::{note_backend_error, Permit, Resource, ResourceBroker};
use crate::clock::Micros;
use crate::error::{BackendError, BrokerError, WaitBound};
use crate::limits::Cost;
use crate::state::{LeaseId, LimitSpec};
use crate::store::{Store, Turn, TurnAsk};

pub(crate) enum SlotOutcome {
    Unlimited,
    /// The lease, and whether the slot was waited for (the first
    /// `take_slot` found every slot held).
    Held(LeaseId, bool),
    TimedOut,
}

/// What one attempt of `enqueue` or `acquire` was given by
/// [`admit_until`].
pub(crate) enum Admitted {
    /// The booked cost, due now, and the slot (an empty permit without a
    /// concurrency limit).
    Go(LiveBooking, Permit),
    /// The cost does not fit within a bound (a wait or a penalty beyond it):
    /// the wait still ahead and the bound, nothing booked.
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

    /// The deadline as a bound (zero without one: never reported then).
    fn deadline_bound(&self) -> WaitBound {
        WaitBound::Deadline(self.deadline.map_or(Duration::ZERO, |(_, d)| d))
    }

    /// The bound a penalty ending at `until` meets, if any.
    fn penalty_beyond(&self, until: tokio::time::Instant) -> Option<WaitBound> {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if let Some(c) = self.ceiling.filter(|&c| left > c) {
            return Some(WaitBound::PenaltyCeiling(c));
        }
        match self.deadline {
            Some((at, d)) if until > at => Some(WaitBound::Deadline(d)),
            _ => None,
        }
    }
}

/// Books `cost` on `key`, waits for its time, then for a slot, all before
/// `deadline`. A penalty (an upstream 429 or an exhausted counter) that came
/// after the booking voids its time: the booking stays spent (its time has
/// come, as a sent call's would), and the cost is booked again when the
/// penalty ends, so the calls the penalty kept leave spaced as the bucket
/// spaces them, not together when it ends. A penalty that came while the call waited
/// for its slot (the call that held the slot got a 429) voids it as well:
/// the slot is given back, and the call waits the hold out; so does the
/// store's penalty of a 429 (or a spent counter) another process got while
/// the call waited for its slot or its booking's time. A booking
/// made under the penalty it then meets (one the store did not make it wait out:
/// the store missed the penalty, or penalizes only a bucket this cost does not
/// draw on) is given back, as a cancelled one is (see `LiveBooking`'s `Drop`):
/// the call is charged once, by the booking it makes when the penalty ends.
///
/// The slot's permit is released on state `key` (`keyed`: a sub-key's
/// state, else the resource's own), and counted in flight if `counted`
/// (see [`Permit::held`]).
pub(crate) async fn admit_until(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    (key, keyed): (&str, bool),
    cost: Cost,
    bounds: &Bounds,
    mut ticket: Option<&mut Ticket>,
    counted: bool,
) -> Result<Admitted, BrokerError> {
    let backend = &broker.inner.backend;
    loop {
        let booked = match ticket.as_deref_mut() {
            Some(ticket) => book_in_line(broker, resource, key, cost, bounds, ticket).await?,
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
                let (permit, waited) = match wait_slot(broker, resource, key, bounds.until())
                    .await?
                {
                    SlotOutcome::Unlimited => (Permit::empty(), false),
                    SlotOutcome::Held(lease, waited) => {
                        let held_key = crate::broker::HeldKey::State(keyed.then(|| key.to_owned()));
                        let permit =
                            Permit::held(backend, resource.clone(), held_key, lease, counted);
                        (permit, waited)
                    }
                    SlotOutcome::TimedOut => return Ok(Admitted::NoSlot(bounds.deadline_bound())),
                };
                // A wait, for the booking's time or for the slot, is when
                // the store may have been penalized since the booking.
                let held = match resource.penalties.until(key) {
                    None if waited || booking.wait > 0 => {
                        store_penalty(broker, resource, key, cost).await?
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
        // Spent if the penalty came after it, else given back (its `Drop`).
        drop(booking);
        if let Some(bound) = bounds.penalty_beyond(until) {
            let now = tokio::time::Instant::now();
            return Ok(Admitted::TooLong(crate::clock::micros(until - now), bound));
        }
        tokio::time::sleep_until(until).await;
    }
}

/// Books `cost` on `key` through the call's place in the line of its
/// state: waits for its turn at no store cost, then, as head, books at
/// most its priority's horizon ahead (see [`queue::horizon`]); further
/// off, it naps until the time is within the horizon (or something gives
/// time back) and asks again. Booked, it leaves the line and the next
/// waiter is head at once. `Err`: a bound met, nothing booked.
async fn book_in_line(
    broker: &ResourceBroker,
    resource: &Arc<Resource>,
    key: &str,
    cost: Cost,
    bounds: &Bounds,
    ticket: &mut Ticket,
) -> Result<Result<LiveBooking, Admitted>, BrokerError> {
    ticket.join();
    // The shared ledger charged this booking's flow (see `shared_turn`).
    let mut charged = false;
    loop {
        if let Some((at, d)) = bounds.deadline {
            if tokio::time::timeout_at(at, ticket.turn()).await.is_err() {
                let ahead = crate::clock::micros(ticket.ahead());
                ticket.leave();
                return Ok(Err(Admitted::TooLong(ahead, WaitBound::Deadline(d))));
            }
        } else {
            ticket.turn().await;
        }
        let spec = resource.latest().spec.clone();
        let horizon = queue::horizon(ticket.priority(), &spec, ticket.units);
        let left = bounds.left();
        if !charged && horizon.is_some() {
            if shared_turn(broker, resource, key, ticket).await == Turn::NotYet {
                if left.is_zero() {
                    let ahead = crate::clock::micros(ticket.ahead());
                    ticket.leave();
                    return Ok(Err(Admitted::TooLong(ahead, bounds.deadline_bound())));
                }
                // Its place kept: asks again in about one token interval.
                ticket
                    .nap(Duration::from_micros(ticket.units).min(left))
                    .await;
                continue;
            }
            charged = true;
        }
        let max_wait = horizon.unwrap_or(Duration::MAX).min(left);
        let wait = match LiveBooking::book(broker, resource, key.to_owned(), cost, max_wait).await?
        {
            Ok(booking) => {
                ticket.leave();
                return Ok(Ok(booking));
            }
            Err(wait) => Duration::from_micros(wait),
        };
        if wait > left {
            ticket.leave();
            let bound = bounds.deadline_bound();
            return Ok(Err(Admitted::TooLong(crate::clock::micros(wait), bound)));
        }
        // A wait beyond the penalty ceiling may be a penalty beyond it.
        if bounds.ceiling.is_some_and(|c| wait > c) {
            let held = match resource.penalties.until(key) {
                Some(until) => Some(until),
                None => store_penalty(broker, resource, key, cost).await?,
            };
            if let Some(until) = held {
                if let Some(bound @ WaitBound::PenaltyCeiling(_)) = bounds.penalty_beyond(until) {
                    ticket.leave();
                    let now = tokio::time::Instant::now();
                    let would = crate::clock::micros(until.saturating_duration_since(now));
                    return Ok(Err(Admitted::TooLong(would, bound)));
                }
            }
        }
        ticket.set_due(crate::clock::tokio_after(wait));
        let nap = wait.saturating_sub(horizon.unwrap_or(Duration::ZERO));
        ticket.nap(nap.max(Duration::from_micros(1))).await;
    }
}

/// The least time a flow stays in the shared turn ledger after its last
/// ask (see [`crate::store::Turns`]); longer for a call of a longer token interval.
const ACTIVE_AT_LEAST: Duration = Duration::from_secs(1);

/// Asks the store's shared turn ledger, if it has one, whether the flow
/// of the head `ticket` may book on state `key` now, which charges the
/// call to its flow when it may. A call without a flow, a store without a
/// ledger, and a ledger that fails to answer (the store out of reach: the
/// local order alone then) give the turn.
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
    let interval = Duration::from_micros(ticket.units);
    let ask = TurnAsk {
        level: ticket.priority().index() as u8,
        flow,
        weight,
        units: ticket.units,
        last: !ticket.flow_queued(),
        active: interval.saturating_mul(4).max(ACTIVE_AT_LEAST),
    };
    turns.turn(key, &ask).await.unwrap_or_else(|e| {
        tracing::debug!(resource = %resource.id, error = %e, "turn ledger unanswered: local order alone");
        Turn::Yours
    })
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
    let mut waited = false;
    loop {
        let freed = resource.slot_notify.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        // A store that answers in process, in the caller's line; any other
        // through `take_slot_later`.
        let held = match backend.local().and_then(|l| l.take_slot_now(key, spec)) {
            Some(held) => held.inspect_err(|e| note_backend_error(resource, "take_slot", e))?,
            None => take_slot_later(backend, resource, key, spec).await?,
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

/// The end of a penalty the store has on state `key` for a call of `cost`,
/// if one is in force ([`Store::wait_left`]: a 429's penalty or a spent
/// counter another process reported, on the buckets the cost draws on, or
/// on a resource without rate limits the state's
/// [`crate::state::ResourceState::penalty`]). Asked by a call that waited for
/// its booking's time or for its slot: a hold put on meanwhile (a 429 of
/// another process, or of the call that held the slot) would otherwise let
/// it go out during the penalty, as this process's own penalties do not know
/// of it. A store that fails to answer reports no penalty on a resource
/// with rate limits: the store granted the booking, which goes ahead as
/// granted.
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

/// `take_slot` on state `key` through the store's asynchronous call, run
/// to its answer if the caller goes away meanwhile (a timeout around
/// `acquire` or `enqueue` while the store is slow): a lease the store
/// grants then is released there, untold, not left held until it expires.
async fn take_slot_later(
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
            .inspect_err(|e| note_backend_error(&resource, "take_slot", e))?;
        let untold = held.map(|lease| UntoldLease::new(lease, backend, resource, key));
        Ok::<_, BackendError>(untold)
    });
    Ok(held.await?.map(UntoldLease::claim))
}
