//! One attempt's admission: its booking, its booked time, penalties, and
//! a concurrency slot.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::booking::LiveBooking;
use crate::broker::in_flight::to_its_answer;
use crate::broker::pending::in_order;
use crate::broker::queue::{self, Ticket};
use crate::broker::{note_backend_error, HeldKey, Permit, Resource};
use crate::clock::{micros, tokio_after, Micros};
use crate::error::{BrokerError, WaitBound};
use crate::limits::Cost;
use crate::stats::Counted;
use crate::store::Turn;

/// Why [`admit_until`] gave one attempt of `enqueue` or `acquire` nothing.
pub(crate) enum Refused {
    /// A wait or a penalty beyond a bound: the wait ahead, nothing booked.
    TooLong(Micros, WaitBound),
    /// No slot came free before the deadline.
    NoSlot(WaitBound),
    /// The store failed.
    Broker(BrokerError),
}

impl From<BrokerError> for Refused {
    fn from(e: BrokerError) -> Self {
        Refused::Broker(e)
    }
}

impl Refused {
    /// The error of an `enqueue` call on `resource` refused after waiting
    /// since `started`.
    pub(crate) fn into_error(self, resource: &Resource, started: Instant) -> BrokerError {
        let (would_wait, bound) = match self {
            Refused::TooLong(wait, bound) => (wait, bound),
            Refused::NoSlot(bound) => (0, bound),
            Refused::Broker(e) => return e,
        };
        BrokerError::WaitTooLong {
            resource: resource.id.clone(),
            waited: started.elapsed(),
            would_wait: Duration::from_micros(would_wait),
            bound,
        }
    }
}

/// What bounds the waits of a call in [`admit_until`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The call's deadline, and its length as the caller gave it.
    pub(crate) deadline: Option<(Instant, Duration)>,
    /// The longest penalty (a 429's, a spent counter's) the call waits out.
    pub(crate) ceiling: Option<Duration>,
}

impl Bounds {
    /// The time left before the deadline (`Duration::MAX` without one).
    fn left(&self) -> Duration {
        self.deadline.map_or(Duration::MAX, |(at, _)| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// The deadline as a bound (zero without one).
    fn deadline_bound(&self) -> WaitBound {
        WaitBound::Deadline(self.deadline.map_or(Duration::ZERO, |(_, d)| d))
    }

    /// The refusal of a penalty ending at `until` that meets a bound, if
    /// it does.
    fn penalty_beyond(&self, until: Instant) -> Option<Refused> {
        let left = until.saturating_duration_since(Instant::now());
        let bound = match (self.ceiling, self.deadline) {
            (Some(c), _) if left > c => WaitBound::PenaltyCeiling(c),
            (_, Some((at, d))) if until > at => WaitBound::Deadline(d),
            _ => return None,
        };
        Some(Refused::TooLong(micros(left), bound))
    }
}

/// Books `cost` on `key`, waits for its time and a slot within `bounds`; a
/// later penalty voids the booking, which is made again when it ends.
pub(crate) async fn admit_until(
    resource: &Arc<Resource>,
    (key, keyed): (&str, bool),
    cost: Cost,
    bounds: &Bounds,
    ticket: Option<&Ticket>,
    counted: bool,
) -> Result<(LiveBooking, Permit), Refused> {
    loop {
        let booking = match ticket {
            Some(ticket) => book_in_line(resource, key, cost, bounds, ticket).await?,
            None => LiveBooking::book(resource, key.to_owned(), cost, bounds.left())
                .await?
                .map_err(|wait| Refused::TooLong(wait, bounds.deadline_bound()))?,
        };
        booking.sleep_until_due().await;
        let until = match resource.penalties.until(key) {
            Some(until) => until,
            None => {
                let (permit, waited) = wait_slot(resource, (key, keyed), counted, bounds).await?;
                // After a wait the store may have a penalty since.
                match penalty_end(resource, key, cost, waited || booking.wait > 0).await? {
                    Some(until) => until,
                    None => return Ok((booking, permit)),
                }
            }
        };
        drop(booking);
        if let Some(too_long) = bounds.penalty_beyond(until) {
            return Err(too_long);
        }
        tokio::time::sleep_until(until).await;
    }
}

/// Books `cost` on `key` as the head of its line, at most its priority's
/// horizon ahead ([`queue::horizon`]), napping until the time comes
/// within it. Refused: nothing booked.
async fn book_in_line(
    resource: &Arc<Resource>,
    key: &str,
    cost: Cost,
    bounds: &Bounds,
    ticket: &Ticket,
) -> Result<LiveBooking, Refused> {
    // Left on every return, and when the call is dropped.
    ticket.join();
    scopeguard::defer!(ticket.leave());
    // The shared ledger charged this booking's flow.
    let mut charged = false;
    let too_long = |wait| Refused::TooLong(wait, bounds.deadline_bound());
    loop {
        let turn = tokio::time::timeout(bounds.left(), ticket.turn());
        if turn.await.is_err() {
            return Err(too_long(micros(ticket.ahead())));
        }
        let horizon = queue::horizon(ticket.priority, &resource.latest().spec, ticket.units());
        let left = bounds.left();
        if !charged && horizon.is_some() {
            if shared_turn(resource, key, ticket).await == Turn::NotYet {
                if left.is_zero() {
                    return Err(too_long(micros(ticket.ahead())));
                }
                let nap = Duration::from_micros(ticket.units()).min(left);
                ticket.nap(nap).await;
                continue;
            }
            charged = true;
        }
        let max_wait = horizon.unwrap_or(Duration::MAX).min(left);
        let booked = LiveBooking::book(resource, key.to_owned(), cost, max_wait).await?;
        let wait = match booked {
            Ok(booking) => return Ok(booking),
            Err(wait) if Duration::from_micros(wait) > left => return Err(too_long(wait)),
            Err(wait) => Duration::from_micros(wait),
        };
        // A wait beyond the penalty ceiling may be a penalty beyond it.
        if bounds.ceiling.is_some_and(|c| wait > c) {
            let held = penalty_end(resource, key, cost, true).await?;
            let beyond = held.and_then(|until| bounds.penalty_beyond(until));
            if let Some(refused @ Refused::TooLong(_, WaitBound::PenaltyCeiling(_))) = beyond {
                return Err(refused);
            }
        }
        ticket.set_due(tokio_after(wait));
        let nap = wait.saturating_sub(horizon.unwrap_or(Duration::ZERO));
        ticket.nap(nap.max(Duration::from_micros(1))).await;
    }
}

/// Whether the store's shared turn ledger gives the head `ticket`'s flow
/// the turn on `key` (charging it). No flow, no ledger, or no answer: yes.
async fn shared_turn(resource: &Arc<Resource>, key: &str, ticket: &Ticket) -> Turn {
    let turns = resource.backend.turns();
    let Some((turns, ask)) = turns.and_then(|t| Some((t, ticket.ask()?))) else {
        return Turn::Yours;
    };
    turns.turn(key, &ask).await.unwrap_or_else(|e| {
        tracing::debug!(resource = %resource.id, error = %e, "turn ledger unanswered: local order alone");
        Turn::Yours
    })
}

/// How often a waiter re-checks a slot held by another process.
const SLOT_POLL: Duration = Duration::from_millis(25);

/// Waits for a concurrency slot on state `key` within `bounds`: its
/// permit (empty without a concurrency limit, released as `admit_until`'s)
/// and whether it was waited for.
async fn wait_slot(
    resource: &Arc<Resource>,
    (key, keyed): (&str, bool),
    counted: bool,
    bounds: &Bounds,
) -> Result<(Permit, bool), Refused> {
    let spec = &resource.latest().spec;
    if spec.max_concurrent.is_none() {
        return Ok((Permit::empty(), false));
    }
    let mut waited = false;
    // Counted before the first take: a release after it sees the waiter.
    resource.slot_waiters.fetch_add(1, Ordering::SeqCst);
    let _waiting = Counted(&resource.slot_waiters);
    loop {
        let freed = resource.slot_notify.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let permit = move |resource, key: String, lease| {
            let held_key = HeldKey::State(keyed.then_some(key));
            Permit::held(resource, held_key, lease, counted)
        };
        let held = match (resource.backend.local()).and_then(|l| l.take_slot_now(key, spec)) {
            Some(held) => held
                .inspect_err(|e| note_backend_error(resource, "take_slot", e))
                .map_err(BrokerError::from)?
                .map(|lease| permit(resource.clone(), key.to_owned(), lease)),
            // Run to its answer if the caller goes away: the permit of a
            // lease granted then is dropped there, released.
            None => {
                let (resource, owned, spec) = (resource.clone(), key.to_owned(), spec.clone());
                to_its_answer(async move {
                    let take = resource.backend.take_slot(&owned, &spec);
                    let lease = (in_order(&resource, &owned, &spec, take).await)
                        .inspect_err(|e| note_backend_error(&resource, "take_slot", e))?;
                    Ok::<_, BrokerError>(lease.map(|lease| permit(resource, owned, lease)))
                })
                .await?
            }
        };
        if let Some(permit) = held {
            return Ok((permit, waited));
        }
        waited = true;
        let left = bounds.left();
        if left.is_zero() {
            return Err(Refused::NoSlot(bounds.deadline_bound()));
        }
        let _ = tokio::time::timeout(left.min(SLOT_POLL), freed).await;
    }
}

/// The end of a penalty on state `key`: this process's, else, if
/// `ask_store`, the store's for `cost` (another process's). A store that
/// fails reports none on a resource with rate limits.
async fn penalty_end(
    resource: &Arc<Resource>,
    key: &str,
    cost: Cost,
    ask_store: bool,
) -> Result<Option<Instant>, BrokerError> {
    let held = resource.penalties.until(key);
    if held.is_some() || !ask_store {
        return Ok(held);
    }
    let spec = resource.latest().spec.clone();
    let wait = resource.backend.wait_left(key, &spec, cost).await;
    let wait = match wait.inspect_err(|e| note_backend_error(resource, "wait_left", e)) {
        Ok(wait) => wait,
        Err(_) if !spec.buckets.is_empty() => 0,
        Err(e) => return Err(e.into()),
    };
    Ok((wait > 0).then(|| tokio_after(Duration::from_micros(wait))))
}
