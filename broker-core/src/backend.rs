//! The [`Backend`] trait: the only thing a state store implements.
//!
//! A backend holds [`ResourceState`](crate::state::ResourceState)s by key and
//! applies the transitions of [`crate::state`] atomically per key, using its
//! own clock (the in-memory store its [`Clock`](crate::Clock); Redis the
//! server's `TIME`). Waits are returned relative to that clock, so callers
//! never compare clocks across machines. Backends hold state, not policy:
//! retries, queues and failure handling live in the broker.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Micros;
use crate::error::BackendError;
use crate::limits::Cost;
use crate::observed::ObservedLimit;
use crate::state::{Decision, LeaseId, LimitSpec, LocalVerdict, Marks, Reservation};
use crate::stats::BackendHealth;

/// A state store for resource buckets.
///
/// Every method is one atomic decision on one key. The `*_now` methods are
/// an optional synchronous fast path for stores that need no I/O; they
/// return `None` when the store must be called asynchronously.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// `try`: take `cost` (and a concurrency slot, if the spec has a limit)
    /// now, or report the wait. Nothing is consumed when denied.
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError>;

    /// Synchronous [`Backend::try_acquire`], when the store can answer
    /// without I/O.
    fn try_acquire_now(
        &self,
        _key: &str,
        _spec: &LimitSpec,
        _cost: Cost,
    ) -> Option<Result<Decision, BackendError>> {
        None
    }

    /// `reserve`: book `cost` at the earliest time it fits, if within
    /// `max_wait`.
    async fn reserve(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Reservation, BackendError>;

    /// Takes a concurrency slot if one is free; `Some(lease)` when held.
    async fn hold_slot(&self, key: &str, spec: &LimitSpec)
        -> Result<Option<LeaseId>, BackendError>;

    /// Synchronous [`Backend::hold_slot`], when the store can answer
    /// without I/O: a call the broker makes in its caller's line, which
    /// no caller going away can leave in flight.
    fn hold_slot_now(
        &self,
        _key: &str,
        _spec: &LimitSpec,
    ) -> Option<Result<Option<LeaseId>, BackendError>> {
        None
    }

    /// Frees the slot held under `lease`. Idempotent; true if it was held.
    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError>;

    /// Extends `lease`, if it is still held on the state at `key`, to the
    /// spec's `lease_ttl` from now; true when it was held. The broker
    /// renews the leases of live permits on a store whose leases expire
    /// (see [`Backend::leases_end_with_holders`]), so that a hold longer
    /// than `lease_ttl` keeps its slot while a dead holder's still
    /// expires. The default, for a store whose leases end with their
    /// holders, has nothing to extend.
    async fn renew(
        &self,
        _key: &str,
        _spec: &LimitSpec,
        _lease: LeaseId,
    ) -> Result<bool, BackendError> {
        Ok(true)
    }

    /// Takes a concurrency slot again under `lease`, the lease of a live
    /// permit that [`Backend::renew`] found gone (it expired while the
    /// store was out of reach, was lost with the store's data in a restart
    /// or a failover, or was granted by a failure policy and never
    /// stored): true when a slot was free and is now held under it, as
    /// [`Backend::hold_slot`] would take it (false, with nothing taken,
    /// when the slots are all held: the limit is then exceeded until the
    /// permit ends). So the store counts the work that is really running
    /// again. The default, for a store whose leases end with their
    /// holders, has nothing to take again.
    async fn retake(
        &self,
        _key: &str,
        _spec: &LimitSpec,
        _lease: LeaseId,
    ) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Synchronous [`Backend::release`], when the store can answer without
    /// I/O (used from `Drop`).
    fn release_now(&self, _key: &str, _lease: LeaseId) -> Option<Result<bool, BackendError>> {
        None
    }

    /// Told, without I/O, that a [`Backend::release`] of `lease` on `key`
    /// is about to be sent from a task of its own (a permit dropped where
    /// [`Backend::release_now`] had no answer). A store whose next
    /// decision could overtake that release (another connection, a batch)
    /// keeps it, and sends it ahead of a later decision on `key` from this
    /// process: a slot freed here is free to the next caller here. The
    /// default does nothing.
    fn release_sent(&self, _key: &str, _lease: LeaseId) {}

    /// The release [`Backend::release_sent`] announced will not be sent
    /// (its task was dropped before it ran), or was: forget it, without
    /// I/O. The default does nothing.
    fn release_unsent(&self, _key: &str, _lease: LeaseId) {}

    /// The release [`Backend::release_sent`] announced, sent from its task:
    /// nothing to do if a decision already sent it. The default is
    /// [`Backend::release`].
    async fn release_announced(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        self.release(key, lease).await
    }

    /// `settle`: correct the charge from `reserved` to `actual`. `since`:
    /// the [`Reservation::since`] marks of the reservation settled, when
    /// there was one; a refund is not made to a bucket held past its mark
    /// (a hold put on after the booking, see [`crate::bucket::settle`]),
    /// nor, without marks, while a hold is on.
    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        reserved: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError>;

    /// Synchronous [`Backend::settle`], when the store can answer without
    /// I/O (used from `Drop` to refund a cancelled reservation).
    fn settle_now(
        &self,
        _key: &str,
        _spec: &LimitSpec,
        _reserved: Cost,
        _actual: Cost,
        _since: Option<Marks>,
    ) -> Option<Result<(), BackendError>> {
        None
    }

    /// `penalize`: drain and hold every bucket for `hold` from the store's
    /// now; a resource without rate limits has its state held instead
    /// ([`crate::state::ResourceState::hold`]), so that `try_acquire` and
    /// `reserve` wait for the end on every user of the store. Never
    /// shortens a longer penalty.
    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        hold: Duration,
    ) -> Result<(), BackendError>;

    /// `hold_left` ([`crate::state::hold_left`]): how long, from the
    /// store's now, a call of `cost` on the state at `key` is still held
    /// by a 429's penalty or a spent counter's hold; 0 for none. Changes
    /// nothing. The broker asks it when a call wakes from its booking's
    /// time or its wait for a slot, so that a hold another process put on
    /// meanwhile holds the call too. The default asks [`Backend::reserve`]
    /// for nothing within no wait, which sees the hold of a state without
    /// buckets only.
    async fn hold_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        // Sees no bucket's hold, whatever the cost.
        let _ = cost;
        let nothing = Cost {
            requests: 0,
            tokens: 0,
        };
        Ok(self.reserve(key, spec, nothing, Duration::ZERO).await?.wait)
    }

    /// `reconcile`: narrow the buckets to what the upstream reported.
    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError>;

    /// The states of one resource, for stores that hold them in this
    /// process: `resource_key` is the resource's state key (its escaped id)
    /// and `spec` its compiled limits. The broker resolves it once per
    /// registration and then answers `try_acquire` on the resource and its
    /// sub-keys through it, without building a state key per call. The
    /// states are the ones the keyed methods reach: the state of sub-key
    /// `k` is the one at [`keyed`](crate::keys::keyed)`(id, k)`. `None`
    /// (the default) for stores that need I/O.
    fn local_states(
        &self,
        _resource_key: &str,
        _spec: Arc<LimitSpec>,
    ) -> Option<Arc<dyn LocalStates>> {
        None
    }

    /// Whether the store lives and dies with the process that holds its
    /// leases (the in-memory store): then a lease ends only when its
    /// permit is released or dropped, and never expires, since its holder
    /// cannot die apart from it. `false` (the default) for stores shared
    /// by processes, where a lease not released within the resource's
    /// `lease_ttl` expires, as its holder may have died.
    fn leases_end_with_holders(&self) -> bool {
        false
    }

    /// Reachability of the store and the calls its failure policy answered
    /// (for stores that can be unreachable; the default is always up).
    fn health(&self) -> BackendHealth {
        BackendHealth::default()
    }
}

/// One resource's states in a store that answers without I/O (see
/// [`Backend::local_states`]). `sub` is a sub-key as the caller gave it
/// (not escaped), `None` for the resource's own state.
pub trait LocalStates: Send + Sync + 'static {
    /// [`Backend::try_acquire`] on the state of `sub`, answered as a
    /// [`LocalVerdict`]: the same decision, a rate denial's wait possibly
    /// not yet rounded.
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> LocalVerdict;

    /// [`Backend::release`] on the state of `sub`: frees the slot held
    /// under `lease`. Idempotent; true if it was held.
    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool;
}

impl std::fmt::Debug for dyn LocalStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalStates")
    }
}
