//! The broker's check + reject calls: `try_acquire` (at once, or through
//! the store's asynchronous call) and `acquire` (waiting up to a bound).

use std::sync::Arc;
use std::time::Duration;

use super::first_poll::{acquisition, denied, Call, FirstPoll, Later};
use super::permit::HeldKey;
use super::{enqueue, in_flight, note_backend_error, state_key};
use super::{Acquisition, Permit, Resource, ResourceBroker, Target, TryAcquire};
use crate::error::{BackendError, BrokerError};
use crate::limits::Cost;
use crate::state::{Decision, DenyReason, Verdict};
use crate::stats::{bump, Counters};

/// `try_acquire` on a resource by id, as its future holds it.
pub(super) struct ById<'s> {
    broker: &'s ResourceBroker,
    target: Target<'s>,
    cost: Cost,
}

impl<'s> Call<'s> for ById<'s> {
    fn quick(&self, permit: &mut Permit) -> Option<Verdict> {
        self.broker.quick_by_id(self.target, self.cost, permit)
    }

    fn start(self) -> Result<Result<Acquisition, BrokerError>, Later<'s>> {
        let (broker, cost) = (self.broker, self.cost);
        let mut state_key = None;
        broker
            .now_or_later(self.target, cost, &mut state_key)
            .map_err(|resource| {
                Box::pin(broker.try_acquire_later(resource, state_key, cost)) as Later<'s>
            })
    }
}

/// # Check + reject
impl ResourceBroker {
    /// Answers at once: takes `cost` (and a concurrency slot) if available,
    /// else says how long until it would fit. Nothing is consumed when
    /// denied. Dropped before it answers (a caller's timeout while a shared
    /// store is slow), it consumes nothing either: a decision already sent
    /// runs to its answer on a task of its own, which gives back what it
    /// took.
    pub fn try_acquire<'s, 'a: 's>(
        &'s self,
        target: impl Into<Target<'a>>,
        cost: Cost,
    ) -> TryAcquire<'s> {
        TryAcquire(FirstPoll::new(ById {
            broker: self,
            target: target.into(),
            cost,
        }))
    }

    /// [`ResourceBroker::try_acquire`] without waiting, for callers that
    /// can use a synchronous answer (a tower service answering in `call`):
    /// `Some(answer)` when the backend answered without I/O (the in-memory
    /// store), `None` when it must be asked asynchronously; then nothing
    /// was consumed, and `try_acquire` is the call to make.
    ///
    /// ```
    /// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(100)))?;
    /// match broker.try_acquire_now("webhooks", Cost::default()) {
    ///     Some(answer) => println!("allowed: {}", answer?.allowed),
    ///     None => println!("ask with try_acquire(..).await"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire_now<'a>(
        &self,
        target: impl Into<Target<'a>>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        let target = target.into();
        let mut permit = Permit::empty();
        if let Some(v) = self.quick_by_id(target, cost, &mut permit) {
            return Some(Ok(acquisition(v, permit)));
        }
        self.try_acquire_now_in_full(target, cost)
    }

    /// [`ResourceBroker::try_acquire_now`] past its common case, out of
    /// the callers' line.
    pub(super) fn try_acquire_now_in_full(
        &self,
        target: Target<'_>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        self.now_or_later(target, cost, &mut None).ok()
    }

    /// [`ResourceBroker::quick`] on the resource `target` names, if it is
    /// registered.
    pub(super) fn quick_by_id(
        &self,
        target: Target<'_>,
        cost: Cost,
        permit: &mut Permit,
    ) -> Option<Verdict> {
        let registry = self.inner.resources.load();
        self.quick(registry.get(target.resource)?, target.key, cost, permit)
    }

    /// The common case of `try_acquire`, kept short: a store that answers
    /// without I/O, a cost that fits. The verdict is counted, and the slot
    /// of a [`Verdict::Leased`] put in `permit`. Else `None`, with nothing
    /// consumed, and [`ResourceBroker::acquire_now`] makes the answer (or
    /// the error).
    pub(super) fn quick(
        &self,
        resource: &Arc<Resource>,
        key: Option<&str>,
        cost: Cost,
        permit: &mut Permit,
    ) -> Option<Verdict> {
        let local = resource.local.as_ref()?;
        if !resource.fits(cost) {
            return None;
        }
        let v = local.try_acquire(key, cost);
        let counters = &resource.counters;
        Some(self.judge(resource, counters, || HeldKey::sub(key), v, permit))
    }

    /// The answer given without I/O, or the resource whose backend must be
    /// asked asynchronously, with `later` set to the state key to ask for.
    pub(super) fn now_or_later(
        &self,
        target: Target<'_>,
        cost: Cost,
        later: &mut Option<String>,
    ) -> Result<Result<Acquisition, BrokerError>, Arc<Resource>> {
        let registry = self.inner.resources.load();
        let Some(resource) = registry.get(target.resource) else {
            return Ok(Err(BrokerError::UnknownResource(
                target.resource.to_owned(),
            )));
        };
        self.acquire_now(resource, target.key, cost, later)
            .ok_or_else(|| resource.clone())
    }

    /// `try_acquire` on a resource already looked up, without I/O; else
    /// `None` (nothing was consumed), with `later` set to the state key of
    /// sub-key `key` (`None`: the resource's own) for the backend's
    /// asynchronous call. The answer is returned as the callers return it,
    /// so it is written once, in place.
    pub(super) fn acquire_now(
        &self,
        resource: &Arc<Resource>,
        key: Option<&str>,
        cost: Cost,
        later: &mut Option<String>,
    ) -> Option<Result<Acquisition, BrokerError>> {
        if let Err(e) = resource.check_fits(cost) {
            return Some(Err(e));
        }
        // A store that answers in process: the one in-process decision.
        let mut permit = Permit::empty();
        if let Some(v) = self.quick(resource, key, cost, &mut permit) {
            return Some(Ok(acquisition(v, permit)));
        }
        // Any other store is asked by state key, built once for both calls.
        let owned = state_key(resource, key);
        let state = owned.as_deref().unwrap_or(&resource.key);
        let local = self.inner.backend.local();
        let Some(decision) = local.and_then(|l| l.try_acquire_now(state, &resource.spec, cost))
        else {
            *later = owned;
            return None;
        };
        Some(match decision {
            Ok(d) => Ok(self.answer(resource, &resource.counters, || HeldKey::State(owned), d)),
            Err(e) => {
                note_backend_error(resource, "try_acquire", &e);
                Err(e.into())
            }
        })
    }

    /// `try_acquire` through the backend's asynchronous call.
    pub(super) async fn try_acquire_later(
        &self,
        resource: Arc<Resource>,
        owned_key: Option<String>,
        cost: Cost,
    ) -> Result<Acquisition, BrokerError> {
        let backend = self.inner.backend.clone();
        let asked = resource.clone();
        // Run to its answer if the caller goes away meanwhile: a decision
        // that took a cost or a slot then gives them back, unclaimed.
        let decided = in_flight::to_its_answer(async move {
            let key = owned_key.as_deref().unwrap_or(&asked.key);
            let penalty_end = asked.penalties.until(key);
            let decision = backend
                .try_acquire(key, &asked.spec, cost)
                .await
                .inspect_err(|e| note_backend_error(&asked, "try_acquire", e))?;
            let unclaimed =
                in_flight::Unclaimed::new(decision, backend, asked, owned_key, cost, penalty_end);
            Ok::<_, BackendError>(unclaimed)
        });
        let (decision, owned_key) = decided.await?.claim();
        // Counted on the latest registration: one may have replaced this
        // one while the store decided.
        let tally = resource.tally();
        let key = || HeldKey::State(owned_key);
        Ok(self.answer(&resource, &tally.counters, key, decision))
    }

    /// The acquisition of the store's decision `d`, counted in `counters`;
    /// `key` names the state a held lease is released on (made only when a
    /// lease is held).
    pub(super) fn answer(
        &self,
        resource: &Arc<Resource>,
        counters: &Counters,
        key: impl FnOnce() -> HeldKey,
        d: Decision,
    ) -> Acquisition {
        let mut permit = Permit::empty();
        let v = self.judge(resource, counters, key, d.into(), &mut permit);
        Acquisition {
            answered_here: d.answered_here,
            ..acquisition(v, permit)
        }
    }

    /// Counts verdict `v` in `counters` (the resource's, or those of the
    /// registration that replaced it) and returns it, with the slot of a
    /// [`Verdict::Leased`] put in `permit` (`key` names the state it is
    /// released on, made only then).
    pub(super) fn judge(
        &self,
        resource: &Arc<Resource>,
        counters: &Counters,
        key: impl FnOnce() -> HeldKey,
        v: Verdict,
        permit: &mut Permit,
    ) -> Verdict {
        match v {
            Verdict::Allowed => bump(&counters.allowed),
            Verdict::Leased(lease) => {
                bump(&counters.allowed);
                *permit = Permit::held(&self.inner.backend, resource.clone(), key(), lease, true);
            }
            Verdict::Rate(_) | Verdict::Concurrency => bump(&counters.denied),
        }
        v
    }

    /// Waits up to `max_wait` for `cost`, then answers: the cost is booked
    /// if it fits within `max_wait` (so waiters are spaced in order), else
    /// denied at once with the wait time, booking nothing.
    pub async fn acquire<'a>(
        &self,
        target: impl Into<Target<'a>>,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Acquisition, BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        resource.config.limits.check_fits(&resource.id, cost)?;
        let owned_key = state_key(&resource, target.key);
        let state = match &owned_key {
            Some(key) => (key.as_str(), true),
            None => (resource.key.as_str(), false),
        };
        let bounds = enqueue::Bounds {
            deadline: Some((crate::clock::tokio_after(max_wait), max_wait)),
            ceiling: None,
        };
        let (booking, permit) =
            match enqueue::admit_until(self, &resource, state, cost, &bounds, None, true).await? {
                enqueue::Admitted::Go(booking, permit) => (booking, permit),
                enqueue::Admitted::TooLong(wait, _) => {
                    bump(&resource.tally().counters.denied);
                    return Ok(denied(DenyReason::Rate, wait));
                }
                enqueue::Admitted::NoSlot(_) => {
                    bump(&resource.tally().counters.denied);
                    return Ok(denied(DenyReason::Concurrency, 0));
                }
            };
        let booked = booking.consume();
        bump(&resource.tally().counters.allowed);
        Ok(Acquisition {
            answered_here: booked.answered_here(),
            ..acquisition(Verdict::Allowed, permit)
        })
    }
}
