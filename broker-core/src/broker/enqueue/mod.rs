//! Queue + execute: `enqueue` waits for its turn in its state's local
//! queue, books, sleeps to the booked time, takes a concurrency slot, runs
//! the work and retries it by the resource's [`RetryPolicy`](crate::retry::RetryPolicy).

use std::future::Future;
use std::sync::atomic::Ordering;

use super::in_flight::to_its_answer;
use super::queue::{self, Ticket};
use super::{ResourceBroker, Target};
use crate::clock::tokio_after;
use crate::error::BrokerError;
use crate::keys;
use crate::limits::Cost;
use crate::retry::{Outcome, OutcomeClass};
use crate::stats::{bump, Counted};
use crate::telemetry;

mod admit;
mod booking;

use super::feedback::{capped_resets, penalize_spent_counters};

pub(crate) use admit::{admit_until, Bounds, Refused};
pub(crate) use booking::LiveBooking;

/// Passed to the work on every attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// The cost booked for this attempt.
    pub cost: Cost,
}

/// Why `enqueue` returned without a result.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError<E> {
    /// The broker refused before or between attempts (unknown resource,
    /// queue full, cost never fits, a wait beyond its deadline or a penalty
    /// beyond the penalty ceiling, backend down).
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

/// # Queue + execute
impl ResourceBroker {
    /// Waits for a turn on `target` (see [`Target`]), runs `work`, retries it by the
    /// retry policy: [`BrokerError::QueueFull`] at once, [`BrokerError::WaitTooLong`] past a
    /// deadline or the penalty ceiling. Dropped, it leaves the queue, refunds, frees its slot.
    ///
    /// ```
    /// use broker_core::{Cost, Outcome, Priority, ResourceBroker, Target};
    /// # async fn demo(broker: ResourceBroker) {
    /// let answer: Result<String, _> = broker
    ///     .enqueue("openai", Cost::tokens(800), |attempt| async move {
    ///         // call the upstream here; report what happened
    ///         Outcome::<String, std::io::Error>::ok_with_usage("done".into(), Cost::tokens(650))
    ///     })
    ///     .await;
    /// // A batch job of one tenant, behind interactive calls, fair to
    /// // other tenants.
    /// let target = Target::from("openai").priority(Priority::Batch).flow("tenant-a");
    /// let embedded: Result<(), _> = broker
    ///     .enqueue(target, Cost::tokens(300), |_| async {
    ///         Outcome::<(), std::io::Error>::ok(())
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
        let (resource, key) = self.state_of(target)?;
        let fits = resource.config.limits.check_fits(&resource.id, cost);
        fits.inspect_err(|_| bump(&resource.counters.failed))?;
        let (live, capacity) = (&resource.live, resource.config.queue_capacity);
        // Counted for the id: a re-registration does not make room.
        let mut place = Counted(&live.queued);
        let before = live.queued.fetch_add(1, Ordering::AcqRel);
        if before >= capacity as u64 {
            bump(&resource.counters.failed);
            return Err(EnqueueError::Broker(BrokerError::QueueFull {
                resource: resource.id.clone(),
                depth: usize::try_from(before).unwrap_or(usize::MAX),
                capacity,
            }));
        }
        let started = tokio::time::Instant::now();
        let policy = &resource.config.retry;
        let limits = resource.config.paced_limits();
        let deadline = target.deadline.or(resource.config.queue_deadline);
        let bounds = Bounds {
            deadline: deadline.map(|d| (tokio_after(d), d)),
            ceiling: Some(policy.ceiling(&limits)),
        };
        let flow = (target.flow).map_or(("".into(), 1), |(f, w)| (keys::fingerprint(f).into(), w));
        let units = queue::units(&resource.latest().spec, cost);
        let ticket = Ticket::new(&resource.lines, &key, target.priority, flow, units);
        let state = (key.as_str(), target.key.is_some());
        let mut attempt = Attempt { number: 0, cost };
        let result = loop {
            attempt.number += 1;
            let attempts = attempt.number;
            // The slot is not counted in flight: `place` counts this work.
            let admitted = admit_until(&resource, state, cost, &bounds, Some(&ticket), false);
            let (booking, permit) = match admitted.await {
                Ok(go) => go,
                Err(refused) => break Err(refused.into_error(&resource, started).into()),
            };
            if attempts == 1 {
                resource.lines.waits[target.priority.index()].record(started.elapsed());
            }
            let used = booking.consume();
            resource.tally(|c| &c.allowed, 1);
            place.move_to(&live.in_flight);
            let outcome = work(attempt).await;
            let (class, retry_after) = (outcome.class(), outcome.retry_after());
            let observed = outcome.observed().cloned();
            let (result, usage) = match outcome {
                Outcome::Ok { value, usage, .. } => (Ok(value), Some(usage)),
                Outcome::RateLimited { error, .. }
                | Outcome::Transient { error, .. }
                | Outcome::Fatal { error, .. } => (Err(error), None),
            };
            // The penalty before the answer's own: the settlement's.
            let penalty_end = resource.penalties.until(&key);
            // A 429's or a spent counter's penalty goes on before the slot
            // is freed, or a call waiting for the slot would go out into it.
            let penalty = (class == OutcomeClass::RateLimited).then(|| {
                let penalty = policy.rate_limited_pause(attempts, retry_after, &limits);
                resource.penalties.penalize(&key, tokio_after(penalty));
                penalty
            });
            if let Some(observed) = &observed {
                penalize_spent_counters(&resource, &key, &capped_resets(&resource, observed));
            }
            // Likewise in the store, for other processes: the penalty, the
            // settlement, then the reconcile, and only then is the slot
            // freed, run to its end even if this call is dropped meanwhile.
            let (broker, res, k) = (self.clone(), resource.clone(), key.clone());
            to_its_answer(async move {
                if let Some(penalty) = penalty {
                    tracing::info!(
                        resource = %res.id,
                        attempt = attempts,
                        retry_after_ms = retry_after.map(|d| d.as_millis() as u64),
                        hold_ms = penalty.as_millis() as u64,
                        "upstream 429"
                    );
                    let _ = broker.penalize_key(&res, &k, penalty).await;
                }
                if let Some(task) = usage.and_then(|u| used.settle(u, penalty_end, "settle")) {
                    let _ = task.await;
                }
                if let Some(observed) = observed {
                    let _ = broker.reconcile_key(&res, &k, &observed).await;
                }
                drop(permit);
            })
            .await;
            place.move_to(&live.queued);
            let error = match result {
                Ok(value) => break Ok(value),
                Err(error) => error,
            };
            if !class.is_retryable() {
                break Err(EnqueueError::Fatal { error, attempts });
            }
            let Some(pause) = policy.pause(class, attempts, retry_after, &limits) else {
                resource.tally(|c| &c.retries_exhausted, 1);
                telemetry::count(&resource.id, telemetry::RETRIES_EXHAUSTED);
                let last = class;
                tracing::warn!(resource = %resource.id, attempts, ?last, "retry budget exhausted");
                break Err(EnqueueError::RetriesExhausted {
                    error,
                    attempts,
                    last,
                });
            };
            resource.tally(|c| &c.retries, 1);
            tokio::time::sleep(pause).await;
        };
        let ok = result.is_ok();
        resource.tally(|c| if ok { &c.completed } else { &c.failed }, 1);
        result
    }
}

impl<E> EnqueueError<E> {
    /// The class of this error (retryable: a later run of the whole job may
    /// succeed): an exhausted budget's last outcome's; a full queue or wait
    /// too long rate-limited; a backend's transient.
    pub fn class(&self) -> OutcomeClass {
        match self {
            EnqueueError::RetriesExhausted { last, .. } => *last,
            EnqueueError::Broker(
                BrokerError::QueueFull { .. } | BrokerError::WaitTooLong { .. },
            ) => OutcomeClass::RateLimited,
            EnqueueError::Broker(BrokerError::Backend(_)) => OutcomeClass::Transient,
            EnqueueError::Fatal { .. } | EnqueueError::Broker(_) => OutcomeClass::Fatal,
        }
    }
}
