//! The [`Store`] trait: the only thing a state store implements, one method
//! per transition of the model; two optional capabilities, [`LocalStore`]
//! (synchronous calls, for a store in this process) and [`Releases`]
//! (pending releases); and [`Failover`], the failure policy above the
//! stores.
//!
//! A store holds [`ResourceState`](crate::state::ResourceState)s by key and
//! applies the transitions of [`crate::state`] atomically per key, using its
//! own clock (the in-memory store its [`Clock`](crate::Clock); Redis the
//! server's `TIME`). Waits are returned relative to that clock, so callers
//! never compare clocks across machines. Stores hold state, not policy:
//! retries, queues and failure handling live above them.

pub mod failover;
pub mod turns;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Micros;
use crate::error::BackendError;
use crate::limits::Cost;
use crate::observed::ObservedLimit;
use crate::state::{Booking, Decision, LeaseId, LimitSpec, LocalVerdict, Marks};
use crate::stats::BackendHealth;

pub use failover::{Failover, FailurePolicy};
pub use turns::{Turn, TurnAsk, Turns};

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
    /// `try`: take `cost` (and a concurrency slot, if the spec has a limit)
    /// now, or report the wait. Nothing is consumed when denied.
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError>;

    /// `book`: book `cost` at the earliest time it fits, if within
    /// `max_wait`.
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

    /// Extends `lease` to the spec's `lease_ttl` from now, if it is still
    /// held ([`Renewal::Held`]); else takes a slot again under it if one is
    /// free ([`Renewal::Retaken`]: it expired while the store was out of
    /// reach, was lost with the store's data, or was granted by a failure
    /// policy and never stored), or reports it [`Renewal::Gone`], with
    /// nothing taken. The broker renews the leases of live permits on a
    /// store without the [`LocalStore`] capability, whose leases expire,
    /// so that a hold longer than `lease_ttl` keeps its slot while a dead
    /// holder's still expires. The default, for a store whose leases end
    /// with their holders, has nothing to extend.
    async fn renew(
        &self,
        _key: &str,
        _spec: &LimitSpec,
        _lease: LeaseId,
    ) -> Result<Renewal, BackendError> {
        Ok(Renewal::Held)
    }

    /// `settle`: correct the charge from `booked` to `actual`. `since`:
    /// the [`Booking::since`] marks of the booking settled, when
    /// there was one; a refund is not made to a bucket penalized past its mark
    /// (a penalty put on after the booking, see [`crate::bucket::settle`]),
    /// nor, without marks, while a penalty is on.
    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError>;

    /// `penalize`: drain and penalize every bucket for `penalty` from the store's
    /// now; a resource without rate limits has its state penalized instead
    /// ([`crate::state::ResourceState::penalty`]), so that `try_acquire` and
    /// `book` wait for the end on every user of the store. Never
    /// shortens a longer penalty.
    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        penalty: Duration,
    ) -> Result<(), BackendError>;

    /// `reconcile`: narrow the buckets to what the upstream reported.
    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError>;

    /// Reads the state at `key`: how long, from the store's now, a call of
    /// `cost` must still wait out a 429's or a spent counter's penalty
    /// ([`crate::state::penalty_left`]); 0 for none. Changes nothing. The
    /// broker asks it when a call wakes from its booking's time or its wait
    /// for a slot, so that a penalty another process put on meanwhile stops
    /// the call too. The default asks [`Store::book`] for nothing within
    /// no wait, which sees the penalty of a state without buckets only.
    async fn wait_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        // Sees no bucket's penalty, whatever the cost.
        let _ = cost;
        let nothing = Cost {
            requests: 0,
            tokens: 0,
        };
        Ok(self.book(key, spec, nothing, Duration::ZERO).await?.wait)
    }

    /// Reachability of the store and the calls refused while it was out of
    /// reach (for stores that can be unreachable; the default is always up).
    fn health(&self) -> BackendHealth {
        BackendHealth::default()
    }

    /// The synchronous capability of a store in this process (see
    /// [`LocalStore`]); `None` (the default) for a store that needs I/O.
    fn local(&self) -> Option<&dyn LocalStore> {
        None
    }

    /// The turn ledger of weighted flows shared by the processes on this
    /// store (see [`Turns`]); `None` (the default) for a store of one
    /// process, whose local queue is exact.
    fn turns(&self) -> Option<&dyn Turns> {
        None
    }

    /// The pending-release capability of a store (see [`Releases`]);
    /// `None` (the default): a permit dropped without a synchronous
    /// release is released by a plain [`Store::release`] from a task.
    fn releases(&self) -> Option<&dyn Releases> {
        None
    }
}

/// Pending releases: for a store whose next decision could overtake a
/// release sent from a task (another connection, a batch), so that it
/// sends that release ahead of its next decision on the key.
///
/// ```
/// # fn demo(store: &dyn broker_core::Store) {
/// let keeps_pending = store.releases().is_some();
/// # let _ = keeps_pending; }
/// ```
#[async_trait]
pub trait Releases: Send + Sync {
    /// Told, without I/O, that a [`Store::release`] of `lease` on `key`
    /// is about to be sent from a task of its own (a permit dropped with no
    /// synchronous release). The store keeps it, and sends it ahead of a
    /// later decision on `key` from this process: a slot freed here is
    /// free to the next caller here.
    fn release_sent(&self, key: &str, lease: LeaseId);

    /// The release [`Releases::release_sent`] announced will not be sent
    /// (its task was dropped before it ran), or was: forget it, without
    /// I/O.
    fn release_unsent(&self, key: &str, lease: LeaseId);

    /// The release [`Releases::release_sent`] announced, sent from its
    /// task: nothing to do if a decision already sent it.
    async fn release_announced(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError>;
}

/// The answer of [`Store::renew`].
///
/// ```
/// use broker_core::Renewal;
/// assert!(Renewal::Retaken.holds());
/// assert!(!Renewal::Gone.holds());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was held, and is extended.
    Held,
    /// The lease was not held, and a free slot is now held under it.
    Retaken,
    /// The lease was not held, and every slot is taken: nothing was taken.
    Gone,
}

impl Renewal {
    /// Whether the lease is held after the renewal.
    pub fn holds(self) -> bool {
        self != Renewal::Gone
    }
}

/// The synchronous capability of a store that lives in the process of
/// every permit on it (the in-memory store): its transitions need no I/O,
/// so the broker makes them in its caller's line, and its leases end only
/// when their permits do (they are never renewed). Each method may still
/// answer `None` for a call the store wants made through [`Store`].
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

    /// Synchronous [`Store::take_slot`]: a call the broker makes in its
    /// caller's line, which no caller going away can leave in flight.
    fn take_slot_now(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Option<Result<Option<LeaseId>, BackendError>>;

    /// Synchronous [`Store::release`] (used from `Drop`).
    fn release_now(&self, key: &str, lease: LeaseId) -> Option<Result<bool, BackendError>>;

    /// Synchronous [`Store::settle`] (used from `Drop` to refund a
    /// cancelled booking).
    fn settle_now(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Option<Result<(), BackendError>>;

    /// The states of one resource: `resource_key` is the resource's state
    /// key (its escaped id) and `spec` its compiled limits. The broker
    /// resolves it once per registration and then answers `try_acquire` on
    /// the resource and its sub-keys through it, without building a state
    /// key per call. The state of sub-key `k` is the one at
    /// [`keyed`](crate::keys::keyed)`(id, k)`.
    fn states(&self, resource_key: &str, spec: Arc<LimitSpec>) -> Option<Arc<dyn LocalStates>>;
}

/// One resource's states in a store that answers without I/O (see
/// [`LocalStore::states`]). `sub` is a sub-key as the caller gave it
/// (not escaped), `None` for the resource's own state.
pub trait LocalStates: Send + Sync + 'static {
    /// [`Store::try_acquire`] on the state of `sub`, answered as a
    /// [`LocalVerdict`]: the same decision, a rate denial's wait possibly
    /// not yet rounded.
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> LocalVerdict;

    /// [`Store::release`] on the state of `sub`: frees the slot held
    /// under `lease`. Idempotent; true if it was held.
    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool;
}

impl std::fmt::Debug for dyn LocalStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalStates")
    }
}
