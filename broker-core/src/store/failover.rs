//! [`Failover`] wraps a primary store and answers by its [`FailurePolicy`]
//! every call the primary could not take because it was unreachable
//! ([`BackendError::is_unavailable`]); other errors are returned as they are.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{Releases, Renewal, Store, Turns};
use crate::bucket::BucketParams;
use crate::error::BackendError;
use crate::limits::Cost;
use crate::observed::ObservedLimit;
use crate::state::{Booking, Decision, LeaseId, LimitSpec, Marks};
use crate::stats::BackendHealth;
use crate::Micros;

/// What a [`Failover`] answers while its primary store is unreachable.
///
/// [`FailurePolicy::FailClosed`] (the default) never lets more through than
/// the shared quota; [`FailurePolicy::LocalFallback`] is safe only if
/// `share` × replicas ≤ 1; [`FailurePolicy::FailOpen`] trades the quota for
/// availability.
///
/// ```
/// use broker_core::FailurePolicy;
/// assert_eq!(FailurePolicy::default().name(), "fail_closed");
/// ```
#[derive(Clone, Default)]
pub enum FailurePolicy {
    /// Every call returns the primary's error: `try_acquire` and `enqueue`
    /// fail, `penalize`, `reconcile` and `settle` are lost.
    #[default]
    FailClosed,
    /// Every acquisition is allowed at once; `penalize`, `reconcile` and
    /// `settle` are dropped.
    FailOpen,
    /// Decisions come from `store`, in this process, holding `share`
    /// (0 < share ≤ 1) of every limit: bursts times `share` (never rounded
    /// up), periods over `share` (rounded up to a whole µs), concurrency
    /// limits times `share` rounded down. A call such a limit can never
    /// admit fails as under fail-closed. Built by
    /// [`FailurePolicy::local_fallback`].
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
    ///
    /// ```
    /// assert_eq!(broker_core::FailurePolicy::FailOpen.name(), "fail_open");
    /// ```
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

impl std::fmt::Debug for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailurePolicy::LocalFallback { share, .. } => f
                .debug_struct("LocalFallback")
                .field("share", share)
                .finish_non_exhaustive(),
            FailurePolicy::FailClosed => f.write_str("FailClosed"),
            FailurePolicy::FailOpen => f.write_str("FailOpen"),
        }
    }
}

/// The limits of `spec` scaled down to `share` for a local fallback store.
pub fn scaled(spec: &LimitSpec, share: f64) -> LimitSpec {
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
    let no_slot = (slot && scaled.max_concurrent == Some(0))
        .then(|| format!("the local fallback's share {share} of the concurrency limit is no slot"));
    let why = no_slot.or_else(|| {
        scaled.buckets.iter().find_map(|(unit, p)| {
            let c = cost.of(*unit);
            (c as f64 > p.capacity()).then(|| {
                format!(
                    "the local fallback's share {share} of a limit holds {} {}, less than the cost {c}",
                    p.capacity(),
                    unit.as_str()
                )
            })
        })
    });
    match why {
        None => Ok(()),
        Some(why) => Err(BackendError::unavailable(format!(
            "store unreachable, {op} refused: {why}, so it admits nothing while the store is out of reach (raise the share or the limit)"
        ))),
    }
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

/// How a call is answered while the primary is unreachable.
enum Answer<'a> {
    /// Fail-open: allowed, dropped.
    Open,
    /// The fallback store, with the limits scaled to the share.
    Local(&'a dyn Store, LimitSpec, f64),
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

    /// The policy that answers while the primary is unreachable.
    pub fn policy(&self) -> &FailurePolicy {
        &self.policy
    }

    /// The policy's answer to `error` of `op`: the error itself unless the
    /// primary was unreachable, or under fail-closed.
    fn answer(
        &self,
        op: &'static str,
        error: BackendError,
        spec: &LimitSpec,
    ) -> Result<Answer<'_>, BackendError> {
        if !error.is_unavailable() {
            return Err(error);
        }
        crate::telemetry::fallback_used(self.policy.name(), op);
        match &self.policy {
            FailurePolicy::FailClosed => Err(BackendError::unavailable(format!(
                "store unreachable, {op} refused (fail-closed): {}",
                error.message
            ))),
            FailurePolicy::FailOpen => Ok(Answer::Open),
            FailurePolicy::LocalFallback { share, store } => {
                Ok(Answer::Local(&**store, scaled(spec, *share), *share))
            }
        }
    }

    fn granted(&self) -> MutexGuard<'_, HashSet<LeaseId>> {
        self.granted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fallback store, under the local fallback.
    fn fallback(&self) -> Option<&dyn Store> {
        match &self.policy {
            FailurePolicy::LocalFallback { store, .. } => Some(&**store),
            _ => None,
        }
    }

    /// Frees `lease` in the fallback store if that store granted it.
    async fn release_here(&self, key: &str, lease: LeaseId) -> Option<Result<bool, BackendError>> {
        let fallback = self.fallback().filter(|_| self.granted().remove(&lease))?;
        Some(fallback.release(key, lease).await)
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
        let Err(error) = primary else { return primary };
        let decided = match self.answer("try_acquire", error, spec)? {
            Answer::Open => Decision::allow(spec.max_concurrent.map(|_| rand::random())),
            Answer::Local(store, scaled, share) => {
                admissible("try_acquire", &scaled, share, cost, true)?;
                let decided = store.try_acquire(key, &scaled, cost).await?;
                self.granted().extend(decided.lease);
                decided
            }
        };
        Ok(decided.by_failure_policy())
    }

    async fn book(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Booking, BackendError> {
        let primary = self.primary.book(key, spec, cost, max_wait).await;
        let Err(error) = primary else { return primary };
        // Marked as answered here: its settlement goes where its cost went.
        let since = Marks::ANSWERED_HERE;
        match self.answer("book", error, spec)? {
            Answer::Open => Ok(Booking {
                wait: 0,
                booked: true,
                since,
            }),
            Answer::Local(store, scaled, share) => {
                // A booking takes no slot: only the rates count.
                admissible("book", &scaled, share, cost, false)?;
                let booked = store.book(key, &scaled, cost, max_wait).await?;
                Ok(Booking { since, ..booked })
            }
        }
    }

    async fn take_slot(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Result<Option<LeaseId>, BackendError> {
        let primary = self.primary.take_slot(key, spec).await;
        let Err(error) = primary else { return primary };
        match self.answer("take_slot", error, spec)? {
            Answer::Open => Ok(Some(rand::random())),
            Answer::Local(store, scaled, share) => {
                admissible("take_slot", &scaled, share, Cost::requests(0), true)?;
                let held = store.take_slot(key, &scaled).await?;
                self.granted().extend(held);
                Ok(held)
            }
        }
    }

    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        if let Some(released) = self.release_here(key, lease).await {
            return released;
        }
        match self.primary.release(key, lease).await {
            Err(e) => self.answer("release", e, &NO_LIMITS).map(|_| false),
            released => released,
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
        let here = self.granted().contains(&lease);
        if let (true, FailurePolicy::LocalFallback { share, store }) = (here, &self.policy) {
            store.renew(key, &scaled(spec, *share), lease).await?;
        }
        match self.primary.renew(key, spec, lease).await {
            Ok(Renewal::Retaken) => {
                let _ = self.release_here(key, lease).await;
                Ok(Renewal::Retaken)
            }
            // Unreachable: the next renewal tries again.
            Err(e) => self.answer("renew", e, &NO_LIMITS).map(|_| Renewal::Held),
            renewed => renewed,
        }
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
            return match &self.policy {
                FailurePolicy::LocalFallback { share, store } => {
                    let scaled = scaled(spec, *share);
                    store.settle(key, &scaled, booked, actual, None).await
                }
                _ => Ok(()),
            };
        }
        let primary = self.primary.settle(key, spec, booked, actual, since).await;
        let Err(error) = primary else { return primary };
        match self.answer("settle", error, spec)? {
            Answer::Open => Ok(()),
            // Charged in the primary: no refund here (the fallback never
            // took it), but a charge beyond the booking narrows the share.
            Answer::Local(store, scaled, _) => {
                let used = Cost {
                    requests: actual.requests.max(booked.requests),
                    tokens: actual.tokens.max(booked.tokens),
                };
                store.settle(key, &scaled, booked, used, None).await
            }
        }
    }

    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        penalty: Duration,
    ) -> Result<(), BackendError> {
        let primary = self.primary.penalize(key, spec, penalty).await;
        let Err(e) = primary else { return primary };
        match self.answer("penalize", e, spec)? {
            Answer::Open => Ok(()),
            Answer::Local(store, scaled, _) => store.penalize(key, &scaled, penalty).await,
        }
    }

    async fn wait_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        let primary = self.primary.wait_left(key, spec, cost).await;
        let Err(e) = primary else { return primary };
        match self.answer("wait_left", e, spec)? {
            Answer::Open => Ok(0),
            Answer::Local(store, scaled, _) => store.wait_left(key, &scaled, cost).await,
        }
    }

    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError> {
        let primary = self.primary.reconcile(key, spec, observed).await;
        let Err(e) = primary else { return primary };
        match self.answer("reconcile", e, spec)? {
            Answer::Open => Ok(()),
            Answer::Local(store, scaled, _) => store.reconcile(key, &scaled, observed).await,
        }
    }

    fn health(&self) -> BackendHealth {
        self.primary.health()
    }

    /// The primary's ledger: while it is out of reach, its turns fail and
    /// the queue goes by its local order.
    fn turns(&self) -> Option<&dyn Turns> {
        self.primary.turns()
    }

    /// The primary's pending releases and, under a local fallback, the
    /// leases the fallback granted.
    fn releases(&self) -> Option<&dyn Releases> {
        let any = self.primary.releases().is_some() || self.fallback().is_some();
        any.then_some(self as &dyn Releases)
    }
}

#[async_trait]
impl<P: Store> Releases for Failover<P> {
    /// A lease the fallback granted is freed there at once, without I/O.
    fn release_sent(&self, key: &str, lease: LeaseId) {
        let local = self.fallback().and_then(|f| f.local());
        if let Some(local) = local.filter(|_| self.granted().contains(&lease)) {
            if let Some(Ok(_)) = local.release_now(key, lease) {
                self.granted().remove(&lease);
                return;
            }
        }
        if let Some(primary) = self.primary.releases() {
            primary.release_sent(key, lease)
        }
    }

    fn release_unsent(&self, key: &str, lease: LeaseId) {
        if let Some(primary) = self.primary.releases() {
            primary.release_unsent(key, lease)
        }
    }

    async fn release_announced(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        if let Some(released) = self.release_here(key, lease).await {
            return released;
        }
        let released = match self.primary.releases() {
            Some(primary) => primary.release_announced(key, lease).await,
            None => self.primary.release(key, lease).await,
        };
        match released {
            Err(e) => self.answer("release", e, &NO_LIMITS).map(|_| false),
            released => released,
        }
    }
}

/// The spec of a call that takes nothing by limits (a release, a renewal).
const NO_LIMITS: LimitSpec = LimitSpec {
    buckets: Vec::new(),
    max_concurrent: None,
    lease_ttl: 0,
};

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
