//! Check + reject: `try_acquire` (at once, or through the store's
//! asynchronous call) and `acquire` (waiting up to a bound).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::enqueue::{self, LiveBooking, Refused};
use super::permit::HeldKey;
use super::{in_flight, note_backend_error};
use super::{Acquisition, Permit, Resource, ResourceBroker, Target};
use crate::error::{BackendError, BrokerError};
use crate::limits::Cost;
use crate::state::{Decision, DenyReason};

type Boxed<'s> = Pin<Box<dyn Future<Output = Result<Acquisition, BrokerError>> + Send + 's>>;

/// The future of [`ResourceBroker::try_acquire`]: the call is made when it
/// is first polled, never before; an in-process answer needs no allocation.
#[must_use = "futures do nothing unless polled"]
pub struct TryAcquire<'s> {
    pub(super) call: Option<(&'s ResourceBroker, On<'s>, Option<&'s str>, Cost)>,
    pub(super) later: Option<Boxed<'s>>,
}

/// The resource of a call: by id, or a handle's while it is current.
#[derive(Clone, Copy)]
pub(super) enum On<'s> {
    Id(&'s str),
    Resource(&'s Arc<Resource>),
}

impl Future for TryAcquire<'_> {
    type Output = Result<Acquisition, BrokerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some((broker, on, key, cost)) = this.call.take() {
            match broker.acquire_now(on, key, cost) {
                Ok(answer) => return Poll::Ready(answer),
                Err((resource, key)) => {
                    this.later = Some(Box::pin(try_acquire_later(resource, key, cost)));
                }
            }
        }
        let later = this.later.as_mut();
        later
            .expect("`try_acquire` polled after it completed")
            .as_mut()
            .poll(cx)
    }
}

impl std::fmt::Debug for TryAcquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TryAcquire").finish_non_exhaustive()
    }
}

/// The acquisition of decision `d` with `permit`, counted (on the latest
/// registration).
fn acquisition(resource: &Resource, d: Decision, permit: Permit) -> Acquisition {
    resource.tally(|c| if d.allowed { &c.allowed } else { &c.denied }, 1);
    Acquisition {
        allowed: d.allowed,
        wait_time: Duration::from_micros(d.wait),
        denied_by: d.denied_by,
        permit,
        answered_here: d.answered_here,
    }
}

/// The acquisition of decision `d`, counted, holding the slot of its lease
/// if allowed (on the state `key` names).
fn answer(resource: &Arc<Resource>, key: impl FnOnce() -> HeldKey, d: Decision) -> Acquisition {
    let permit = (d.lease.filter(|_| d.allowed)).map_or_else(Permit::empty, |lease| {
        Permit::held(resource.clone(), key(), lease, true)
    });
    acquisition(resource, d, permit)
}

/// `try_acquire` through the backend's asynchronous call.
async fn try_acquire_later(
    resource: Arc<Resource>,
    owned_key: Option<String>,
    cost: Cost,
) -> Result<Acquisition, BrokerError> {
    let asked = resource.clone();
    // Run to its answer if the caller goes away, then given back.
    let decided = in_flight::to_its_answer(async move {
        let key = owned_key.as_deref().unwrap_or(&asked.key);
        let since_here = LiveBooking::since_here(&asked, key);
        let d = asked.backend.try_acquire(key, &asked.spec, cost);
        let d = super::pending::in_order(&asked, key, &asked.spec, d)
            .await
            .inspect_err(|e| note_backend_error(&asked, "try_acquire", e))?;
        let taken = LiveBooking::taken(asked, owned_key, cost, since_here, &d);
        Ok::<_, BackendError>((d, taken))
    });
    let (d, taken) = decided.await?;
    let owned_key = taken.claim();
    Ok(answer(&resource, || HeldKey::State(owned_key), d))
}

/// # Check + reject
impl ResourceBroker {
    /// Takes `cost` (and a concurrency slot) if available, else says how
    /// long until it would fit. Denied, or dropped before it answers, it
    /// consumes nothing (a decision already sent is given back).
    pub fn try_acquire<'s, 'a: 's>(
        &'s self,
        target: impl Into<Target<'a>>,
        cost: Cost,
    ) -> TryAcquire<'s> {
        let target = target.into();
        let call = Some((self, On::Id(target.resource), target.key, cost));
        TryAcquire { call, later: None }
    }

    /// [`ResourceBroker::try_acquire`] without waiting: `None` when the
    /// backend must be asked asynchronously (nothing was consumed).
    pub fn try_acquire_now<'a>(
        &self,
        target: impl Into<Target<'a>>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        let target = target.into();
        self.acquire_now(On::Id(target.resource), target.key, cost)
            .ok()
    }

    /// `try_acquire` on `on` answered without I/O, or `Err` with the
    /// registration and state key (`None`: the resource's own) to ask the
    /// store for asynchronously.
    pub(super) fn acquire_now(
        &self,
        on: On<'_>,
        key: Option<&str>,
        cost: Cost,
    ) -> Result<Result<Acquisition, BrokerError>, (Arc<Resource>, Option<String>)> {
        let registry;
        let resource = match on {
            On::Resource(resource) => resource,
            On::Id(id) => {
                registry = self.inner.resources.load();
                match registry.get(id) {
                    Some(resource) => resource,
                    None => return Ok(Err(BrokerError::UnknownResource(id.to_owned()))),
                }
            }
        };
        if let Err(e) = resource.config.limits.check_fits(&resource.id, cost) {
            return Ok(Err(e));
        }
        if let Some(local) = &resource.local {
            let d = local.try_acquire(key, cost);
            let held = || HeldKey::Sub(key.map(Box::from));
            return Ok(Ok(answer(resource, held, d)));
        }
        let owned = key.map(|k| crate::keys::keyed(&resource.id, k));
        let state = owned.as_deref().unwrap_or(&resource.key);
        let local = resource.backend.local();
        let Some(decision) = local.and_then(|l| l.try_acquire_now(state, &resource.spec, cost))
        else {
            return Err((resource.clone(), owned));
        };
        let decision = decision.inspect_err(|e| note_backend_error(resource, "try_acquire", e));
        Ok((decision.map_err(BrokerError::from))
            .map(|d| answer(resource, || HeldKey::State(owned), d)))
    }

    /// Waits up to `max_wait` for `cost` (booked, so waiters are spaced in
    /// order), else denies at once with the wait time, booking nothing.
    pub async fn acquire<'a>(
        &self,
        target: impl Into<Target<'a>>,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Acquisition, BrokerError> {
        let target = target.into();
        let (resource, key) = self.state_of(target)?;
        resource.config.limits.check_fits(&resource.id, cost)?;
        let state = (key.as_str(), target.key.is_some());
        let bounds = enqueue::Bounds {
            deadline: Some((crate::clock::tokio_after(max_wait), max_wait)),
            ceiling: None,
        };
        let admitted = enqueue::admit_until(&resource, state, cost, &bounds, None, true);
        let denied = |by, wait| (Decision::deny(by, wait), Permit::empty(), false);
        let (d, permit, answered_here) = match admitted.await {
            Ok((b, permit)) => (Decision::allow(None), permit, b.consume().answered_here()),
            Err(Refused::Broker(e)) => return Err(e),
            Err(Refused::TooLong(wait, _)) => denied(DenyReason::Rate, wait),
            Err(Refused::NoSlot(_)) => denied(DenyReason::Concurrency, 0),
        };
        let d = Decision { answered_here, ..d };
        Ok(acquisition(&resource, d, permit))
    }
}
