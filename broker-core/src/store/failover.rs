//! [`Failover`] wraps a primary store and answers by its [`FailurePolicy`]
//! every call the primary could not take because it was unreachable
//! ([`BackendError::is_unavailable`]); other errors are returned as they are.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{Renewal, Store, Turns};
use crate::bucket::BucketParams;
use crate::error::BackendError;
use crate::limits::Cost;
use crate::observed::ObservedLimit;
use crate::state::{Booking, Decision, LeaseId, LimitSpec, Marks};
use crate::stats::BackendHealth;
use crate::Micros;

/// What a [`Failover`] answers while its primary store is unreachable.
/// [`Self::FailClosed`] (the default) keeps the shared quota, [`Self::LocalFallback`]
/// only if `share` × replicas ≤ 1; [`Self::FailOpen`] trades it for availability.
///
/// ```
/// use broker_core::FailurePolicy;
/// assert_eq!(FailurePolicy::default().name(), "fail_closed");
/// ```
#[derive(Debug, Clone, Default)]
pub enum FailurePolicy {
    /// Every call returns the primary's error: `try_acquire` and `enqueue`
    /// fail, `penalize`, `reconcile` and `settle` are lost.
    #[default]
    FailClosed,
    /// Every acquisition is allowed at once; `penalize`, `reconcile` and
    /// `settle` are dropped.
    FailOpen,
    /// Decisions come from `store`, in this process, holding `share`
    /// (0 < share ≤ 1) of every limit, never rounded up; a call that share
    /// can never admit fails as under fail-closed.
    LocalFallback {
        /// The fraction of every limit this process may use alone.
        share: f64,
        /// The store that decides while the primary is unreachable.
        store: Arc<dyn Store>,
    },
}

impl FailurePolicy {
    /// [`FailurePolicy::LocalFallback`] at `share` in `store`.
    ///
    /// ```
    /// # use broker_core::{Store, FailurePolicy};
    /// # fn demo(memory: impl Store) {
    /// let policy = FailurePolicy::local_fallback(0.5, memory);
    /// assert_eq!(policy.name(), "local_fallback");
    /// # }
    /// ```
    pub fn local_fallback(share: f64, store: impl Store) -> Self {
        FailurePolicy::LocalFallback {
            share,
            store: Arc::new(store),
        }
    }

    /// `"fail_closed"`, `"fail_open"` or `"local_fallback"` (metric labels).
    pub fn name(&self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::LocalFallback { .. } => "local_fallback",
        }
    }

    /// An error naming `share` when a local fallback's share is not in
    /// (0, 1].
    ///
    /// ```
    /// # use broker_core::{Store, FailurePolicy};
    /// # fn demo(memory: impl Store) {
    /// assert!(FailurePolicy::local_fallback(1.5, memory).check().is_err());
    /// # }
    /// ```
    pub fn check(&self) -> Result<(), BackendError> {
        match self {
            FailurePolicy::LocalFallback { share, .. } if !(*share > 0.0 && *share <= 1.0) => {
                Err(BackendError::new(format!(
                    "LocalFallback share must be in (0, 1], got {share}"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// The limits of `spec` scaled down to `share` for a local fallback store:
/// bursts times `share` (never rounded up), periods over `share` (rounded
/// up to a whole µs), concurrency limits times `share` rounded down.
fn scaled(spec: &LimitSpec, share: f64) -> LimitSpec {
    LimitSpec {
        buckets: (spec.buckets.iter())
            .map(|(unit, p)| {
                let period = (p.period() / share).ceil();
                let params = BucketParams::new(p.capacity() * share, p.amount(), period);
                (*unit, params)
            })
            .collect(),
        max_concurrent: (spec.max_concurrent).map(|m| (m as f64 * share).floor() as u32),
        lease_ttl: spec.lease_ttl,
    }
}

/// Refuses `op` of `cost` (with a slot if `slot`) when the `scaled` limits
/// can never admit it: a denial would promise a wait that never ends.
fn admissible(
    op: &str,
    scaled: &LimitSpec,
    share: f64,
    cost: Cost,
    slot: bool,
) -> Result<(), BackendError> {
    let short = (scaled.buckets.iter()).find(|(u, p)| cost.of(*u) as f64 > p.capacity());
    let why = match short {
        _ if slot && scaled.max_concurrent == Some(0) => "the concurrency limit is no slot".into(),
        Some((u, p)) => format!(
            "a limit holds {} {}, less than the cost {}",
            p.capacity(),
            u.as_str(),
            cost.of(*u)
        ),
        None => return Ok(()),
    };
    Err(BackendError::unavailable(format!(
        "store unreachable, {op} refused: the local fallback's share {share} of {why}, so it admits nothing while the store is out of reach (raise the share or the limit)"
    )))
}

/// A store that answers by a [`FailurePolicy`] while its primary is
/// unreachable, marking such answers ([`Decision::answered_here`],
/// [`Marks::ANSWERED_HERE`]) and counting them in the metrics.
///
/// ```
/// use broker_core::{Failover, FailurePolicy, ResourceBroker};
/// # fn demo(primary: impl broker_core::Store, memory: impl broker_core::Store) -> Result<(), broker_core::BackendError> {
/// let store = Failover::new(primary, FailurePolicy::local_fallback(0.5, memory))?;
/// let broker = ResourceBroker::new(store);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Failover<P> {
    primary: P,
    policy: FailurePolicy,
    /// The leases the fallback store holds: renewed and freed there.
    granted: Arc<Mutex<HashSet<LeaseId>>>,
}

impl<P: Store> Failover<P> {
    /// `primary` under `policy`; an error naming `share` when a local
    /// fallback's share is not in (0, 1].
    pub fn new(primary: P, policy: FailurePolicy) -> Result<Self, BackendError> {
        policy.check()?;
        Ok(Self {
            primary,
            policy,
            granted: Arc::default(),
        })
    }

    /// The store wrapped.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The primary's answer `primary`, else (unreachable) the policy's to
    /// `op`: an error under fail-closed, `open()` under fail-open,
    /// `fallback(store, spec scaled, share)` under a local fallback.
    async fn or_policy<T, F>(
        &self,
        op: &'static str,
        spec: &LimitSpec,
        primary: Result<T, BackendError>,
        open: impl FnOnce() -> T,
        fallback: impl FnOnce(Arc<dyn Store>, LimitSpec, f64) -> F,
    ) -> Result<T, BackendError>
    where
        F: Future<Output = Result<T, BackendError>>,
    {
        let error = match primary {
            Err(e) if e.is_unavailable() => e,
            answer => return answer,
        };
        crate::telemetry::fallback_used(self.policy.name(), op);
        match &self.policy {
            FailurePolicy::FailClosed => Err(BackendError::unavailable(format!(
                "store unreachable, {op} refused (fail-closed): {}",
                error.message
            ))),
            FailurePolicy::FailOpen => Ok(open()),
            FailurePolicy::LocalFallback { share, store } => {
                fallback(store.clone(), scaled(spec, *share), *share).await
            }
        }
    }

    /// Frees `lease` in the fallback store if that store granted it.
    async fn release_here(&self, key: &str, lease: LeaseId) -> Option<Result<bool, BackendError>> {
        match &self.policy {
            FailurePolicy::LocalFallback { store, .. } if self.granted.lock().remove(&lease) => {
                Some(store.release(key, lease).await)
            }
            _ => None,
        }
    }
}

#[async_trait]
impl<P: Store> Store for Failover<P> {
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError> {
        let primary = self.primary.try_acquire(key, spec, cost).await;
        let open =
            || Decision::allow(spec.max_concurrent.map(|_| rand::random())).by_failure_policy();
        let local = |store: Arc<dyn Store>, scaled: LimitSpec, share: f64| async move {
            admissible("try_acquire", &scaled, share, cost, true)?;
            let decided = store.try_acquire(key, &scaled, cost).await?;
            self.granted.lock().extend(decided.lease);
            Ok(decided.by_failure_policy())
        };
        self.or_policy("try_acquire", spec, primary, open, local)
            .await
    }

    async fn book(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Booking, BackendError> {
        let primary = self.primary.book(key, spec, cost, max_wait).await;
        // Marked as answered here: its settlement goes where its cost went.
        let since = Marks::ANSWERED_HERE;
        let open = || Booking {
            wait: 0,
            booked: true,
            since,
        };
        let local = |store: Arc<dyn Store>, scaled: LimitSpec, share: f64| async move {
            // A booking takes no slot: only the rates count.
            admissible("book", &scaled, share, cost, false)?;
            let booked = store.book(key, &scaled, cost, max_wait).await?;
            Ok(Booking { since, ..booked })
        };
        self.or_policy("book", spec, primary, open, local).await
    }

    async fn take_slot(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Result<Option<LeaseId>, BackendError> {
        let primary = self.primary.take_slot(key, spec).await;
        let open = || Some(rand::random());
        let local = |store: Arc<dyn Store>, scaled: LimitSpec, share: f64| async move {
            admissible("take_slot", &scaled, share, Cost::requests(0), true)?;
            let held = store.take_slot(key, &scaled).await?;
            self.granted.lock().extend(held);
            Ok(held)
        };
        self.or_policy("take_slot", spec, primary, open, local)
            .await
    }

    /// A lease the fallback granted is freed there; the primary's error is
    /// returned as it is, for the release to be kept and sent again.
    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        match self.release_here(key, lease).await {
            Some(released) => released,
            None => self.primary.release(key, lease).await,
        }
    }

    /// A lease the fallback granted is renewed there and at the primary:
    /// once the primary answers, it takes the lease again and the fallback
    /// frees it, so the primary counts the work running.
    async fn renew(
        &self,
        key: &str,
        spec: &LimitSpec,
        lease: LeaseId,
    ) -> Result<Renewal, BackendError> {
        let here = self.granted.lock().contains(&lease);
        if let (true, FailurePolicy::LocalFallback { share, store }) = (here, &self.policy) {
            store.renew(key, &scaled(spec, *share), lease).await?;
        }
        let renewed = self.primary.renew(key, spec, lease).await;
        if let Ok(Renewal::Retaken) = renewed {
            let _ = self.release_here(key, lease).await;
        }
        // Unreachable: the next renewal tries again.
        let local = |_, _, _| async { Ok(Renewal::Held) };
        self.or_policy("renew", spec, renewed, || Renewal::Held, local)
            .await
    }

    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError> {
        if since == Some(Marks::ANSWERED_HERE) {
            // Never charged in the primary: a fallback booking is settled
            // there (without marks, which name that store's penalties).
            let FailurePolicy::LocalFallback { share, store } = &self.policy else {
                return Ok(());
            };
            return store
                .settle(key, &scaled(spec, *share), booked, actual, None)
                .await;
        }
        let primary = self.primary.settle(key, spec, booked, actual, since).await;
        // Charged in the primary: no refund here (the fallback never took
        // it), but a charge beyond the booking narrows the share.
        let used = Cost {
            requests: actual.requests.max(booked.requests),
            tokens: actual.tokens.max(booked.tokens),
        };
        let local = |store: Arc<dyn Store>, scaled: LimitSpec, _| async move {
            store.settle(key, &scaled, booked, used, None).await
        };
        self.or_policy("settle", spec, primary, || (), local).await
    }

    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        penalty: Duration,
    ) -> Result<(), BackendError> {
        let primary = self.primary.penalize(key, spec, penalty).await;
        let local = |store: Arc<dyn Store>, scaled: LimitSpec, _| async move {
            store.penalize(key, &scaled, penalty).await
        };
        self.or_policy("penalize", spec, primary, || (), local)
            .await
    }

    async fn wait_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        let primary = self.primary.wait_left(key, spec, cost).await;
        let local = |store: Arc<dyn Store>, scaled: LimitSpec, _| async move {
            store.wait_left(key, &scaled, cost).await
        };
        self.or_policy("wait_left", spec, primary, || 0, local)
            .await
    }

    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError> {
        let primary = self.primary.reconcile(key, spec, observed).await;
        let local = |store: Arc<dyn Store>, scaled: LimitSpec, _| async move {
            store.reconcile(key, &scaled, observed).await
        };
        self.or_policy("reconcile", spec, primary, || (), local)
            .await
    }

    fn health(&self) -> BackendHealth {
        self.primary.health()
    }

    /// The primary's ledger: while it is out of reach, its turns fail and
    /// the queue goes by its local order.
    fn turns(&self) -> Option<&dyn Turns> {
        self.primary.turns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, RateLimit};

    #[test]
    fn fallback_limits_are_a_fraction_never_the_full_bucket() {
        let limits = Limits::new()
            .rate(RateLimit::per_second(10).with_burst(10))
            .max_concurrent(4);
        let spec = LimitSpec::new(&limits, Duration::from_secs(30));
        let half = scaled(&spec, 0.5);
        let p = half.buckets[0].1;
        assert_eq!(p.capacity(), 5.0);
        assert_eq!(p.amount() / p.period() * 1e6, 5.0);
        assert_eq!(half.max_concurrent, Some(2));
        let tiny = Limits::new()
            .rate(RateLimit::per_second(1).with_burst(1))
            .max_concurrent(1);
        let tiny = scaled(&LimitSpec::new(&tiny, Duration::from_secs(30)), 0.5);
        assert_eq!(
            tiny.buckets[0].1.capacity(),
            0.5,
            "never rounded up to a full bucket"
        );
        assert_eq!(tiny.max_concurrent, Some(0));
    }
}
