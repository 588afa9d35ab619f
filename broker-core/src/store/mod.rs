//! The [`Store`] trait (one atomic method per transition of [`crate::state`],
//! on the store's own clock), its optional capabilities [`LocalStore`] and
//! [`Turns`], and [`Failover`].

pub mod failover;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Micros;
use crate::error::BackendError;
use crate::limits::Cost;
use crate::observed::ObservedLimit;
use crate::state::{Booking, Decision, LeaseId, LimitSpec, Marks};
use crate::stats::BackendHealth;

pub use failover::{Failover, FailurePolicy};

/// A state store for resource buckets: every method is one atomic
/// transition of the model on one key.
///
/// ```
/// # async fn demo(store: impl broker_core::Store) -> Result<(), broker_core::BackendError> {
/// use broker_core::{Cost, LimitSpec, Limits, RateLimit};
/// let spec = LimitSpec::new(&Limits::new().rate(RateLimit::per_second(5)), std::time::Duration::from_secs(30));
/// let decision = store.try_acquire("api", &spec, Cost::default()).await?;
/// # let _ = decision; Ok(()) }
/// ```
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Takes `cost` (and a slot, under a concurrency limit) now, or reports
    /// the wait, consuming nothing.
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError>;

    /// Books `cost` at the earliest time it fits, if within `max_wait`.
    async fn book(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Booking, BackendError>;

    /// Takes a concurrency slot if one is free; `Some(lease)` when taken.
    async fn take_slot(&self, key: &str, spec: &LimitSpec)
        -> Result<Option<LeaseId>, BackendError>;

    /// Frees the slot held under `lease`. Idempotent; true if it was held.
    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError>;

    /// Extends `lease` to `lease_ttl` from now ([`Renewal::Held`]), else retakes
    /// a free slot ([`Renewal::Retaken`]) or nothing ([`Renewal::Gone`]). The
    /// default, for leases that end with their permits, has nothing to extend.
    async fn renew(
        &self,
        _key: &str,
        _spec: &LimitSpec,
        _lease: LeaseId,
    ) -> Result<Renewal, BackendError> {
        Ok(Renewal::Held)
    }

    /// Corrects the charge from `booked` to `actual`. `since`: the settled
    /// booking's [`Booking::since`]; no refund goes to a bucket penalized
    /// past its mark (see [`crate::bucket::settle`]).
    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError>;

    /// Drains and penalizes every bucket for `penalty` from the store's now
    /// (see [`crate::state::penalize`]); never shortens a longer penalty.
    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        penalty: Duration,
    ) -> Result<(), BackendError>;

    /// Narrows the buckets to what the upstream reported.
    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError>;

    /// How long a call of `cost` must still wait out a penalty
    /// ([`crate::state::penalty_left`]), changing nothing. The default books
    /// nothing, which sees only the penalty of a state without buckets.
    async fn wait_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        _cost: Cost,
    ) -> Result<Micros, BackendError> {
        let nothing = Cost::requests(0);
        Ok(self.book(key, spec, nothing, Duration::ZERO).await?.wait)
    }

    /// Reachability of the store (the default is always up).
    fn health(&self) -> BackendHealth {
        BackendHealth::default()
    }

    /// The synchronous capability of a store in this process.
    fn local(&self) -> Option<&dyn LocalStore> {
        None
    }

    /// The turn ledger shared by the processes on this store.
    fn turns(&self) -> Option<&dyn Turns> {
        None
    }
}

tokio::task_local! {
    pub(crate) static BEGUN: tokio::time::Instant;
}

/// When the broker's call running on this task began, if it sent releases
/// ahead of its decision: a store bounds both from there, as one call.
///
/// ```
/// assert!(broker_core::store::begun().is_none());
/// ```
pub fn begun() -> Option<tokio::time::Instant> {
    BEGUN.try_with(|at| *at).ok()
}

/// The answer of [`Store::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was held, and is extended.
    Held,
    /// The lease was not held, and a free slot is now held under it.
    Retaken,
    /// The lease was not held, and every slot is taken: nothing was taken.
    Gone,
}

/// The synchronous capability of a store in the process of every permit on
/// it: no I/O, leases end only with their permits. A method may answer
/// `None` for a call to be made through [`Store`].
///
/// ```
/// # fn demo(store: &dyn broker_core::Store) {
/// let in_process = store.local().is_some();
/// # let _ = in_process; }
/// ```
pub trait LocalStore: Send + Sync {
    /// Synchronous [`Store::try_acquire`].
    fn try_acquire_now(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Option<Result<Decision, BackendError>>;

    /// Synchronous [`Store::take_slot`].
    fn take_slot_now(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Option<Result<Option<LeaseId>, BackendError>>;

    /// Synchronous [`Store::release`] (used from `Drop`).
    fn release_now(&self, key: &str, lease: LeaseId) -> Option<Result<bool, BackendError>>;

    /// Synchronous [`Store::settle`] (used from `Drop`).
    fn settle_now(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Option<Result<(), BackendError>>;

    /// The states of the resource at state key `resource_key` under `spec`;
    /// sub-key `k`'s state is the one at [`keyed`](crate::keys::keyed)`(id, k)`.
    fn states(&self, resource_key: &str, spec: Arc<LimitSpec>) -> Option<Arc<dyn LocalStates>>;
}

/// One resource's states in a store without I/O ([`LocalStore::states`]);
/// `sub` is a sub-key as given (not escaped), `None` for the resource's own.
pub trait LocalStates: Send + Sync + 'static {
    /// [`Store::try_acquire`] on the state of `sub`.
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Decision;

    /// [`Store::release`] on the state of `sub`.
    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool;
}

impl std::fmt::Debug for dyn LocalStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalStates")
    }
}

/// A flow's ask for a turn on one state (see [`Turns::turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnAsk<'a> {
    /// The priority level's index: one ledger per level.
    pub level: u8,
    /// The flow's fingerprint (never the caller's id).
    pub flow: &'a str,
    /// The flow's weight (at least 1).
    pub weight: u32,
    /// The call's cost as the time it refills in the slowest bucket, µs.
    pub units: u64,
    /// The call is its flow's last waiter in this process: once served, the
    /// flow leaves the ledger after `units` unless it asks again.
    pub last: bool,
    /// How long a flow stays in the ledger after its last ask.
    pub active: Duration,
}

/// The answer of [`Turns::turn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The flow may book now; the call's cost is charged to it.
    Yours,
    /// Other flows are behind this one: ask again a little later.
    NotYet,
}

/// A turn ledger shared by every process on a store: each active flow's served
/// cost over weight. A joining flow starts at the least; a flow may book while
/// at most one quantum (`units / weight`) ahead of it, and is then charged.
///
/// ```
/// # async fn demo(store: &dyn broker_core::Store) -> Result<(), broker_core::BackendError> {
/// use broker_core::store::{Turn, TurnAsk};
/// if let Some(turns) = store.turns() {
///     let ask = TurnAsk { level: 1, flow: "3f2a9c0d1b7e6a45", weight: 1, units: 100_000, last: false, active: std::time::Duration::from_secs(1) };
///     let mine = turns.turn("api", &ask).await? == Turn::Yours;
///     # let _ = mine;
/// }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Turns: Send + Sync {
    /// Whether `ask.flow` may book a call on state `key` now; if so, the
    /// call is charged to the flow, atomically with the answer.
    async fn turn(&self, key: &str, ask: &TurnAsk<'_>) -> Result<Turn, BackendError>;
}
