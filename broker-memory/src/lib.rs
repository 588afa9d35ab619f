//! # broker-memory
//!
//! [`MemoryBackend`]: resource states in a [`dashmap::DashMap`], each behind
//! its own mutex, decided by broker-core's reference transitions. Idle states
//! are evicted; past [`MemoryBackend::max_states`] the least recently used are
//! folded into places that never hand a key back more than it had.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod eviction;
mod key;
mod local;
mod spill;
mod states;
mod store;

pub use clock::QuantaClock;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use broker_core::clock::micros;
use broker_core::state::{self, ResourceState};
use broker_core::{
    BackendError, Booking, Clock, Cost, Decision, LeaseId, LimitSpec, LocalStates, LocalStore,
    Marks, Micros, ObservedLimit, Renewal,
};
use store::Store;

/// One process's state store.
///
/// ```
/// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
/// use broker_memory::MemoryBackend;
/// let broker = ResourceBroker::new(MemoryBackend::new());
/// broker.register_limit("api", Limits::new().rate(RateLimit::per_second(10))).unwrap();
/// ```
#[derive(Debug)]
pub struct MemoryBackend {
    store: Arc<Store>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// # Making a store
impl MemoryBackend {
    /// A store on [`QuantaClock`].
    pub fn new() -> Self {
        Self::with_clock(QuantaClock::new())
    }

    /// A store on `clock` (e.g. [`broker_core::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::with_shared_clock(Arc::new(clock))
    }

    /// A store on a shared clock.
    pub fn with_shared_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            store: Arc::new(Store::new(clock)),
        }
    }

    /// Bounds the number of states at `max` (at least 64; 1,048,576 unless
    /// set). Past it, idle states go first, then the least recently used down
    /// to seven eighths of the bound, each folded into a place of its own
    /// (past a budget, one shared by keys), so a dropped key never comes back
    /// with more than it had. States holding a slot, under a penalty of a resource without
    /// rate limits, or a registered resource's own state are never dropped.
    ///
    /// ```
    /// use broker_memory::MemoryBackend;
    /// let backend = MemoryBackend::new().max_states(100_000);
    /// assert_eq!(backend.state_bound(), 100_000);
    /// ```
    pub fn max_states(self, max: usize) -> Self {
        self.store.sweeper.set_max(max);
        self.store.spills.set_max(max);
        self
    }
}

/// # Inspecting a store
impl MemoryBackend {
    /// The bound on the number of states (see [`MemoryBackend::max_states`]).
    pub fn state_bound(&self) -> usize {
        self.store.sweeper.max()
    }

    /// How many states were folded at the bound so far.
    pub fn folded(&self) -> u64 {
        self.store.spills.folded()
    }

    /// Number of states held now (idle ones not yet evicted included).
    pub fn len(&self) -> usize {
        self.store.states.len()
    }

    /// True when no state is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every state equal to a fresh one and unused for 50 ms (but a
    /// registered resource's own state); returns how many. Also runs by
    /// itself as the map grows.
    pub fn evict_idle(&self) -> usize {
        let store = &self.store;
        let now = store.clock.now();
        let evicted = eviction::evict_idle(store, now);
        store.spills.drop_idle(now);
        store.sweeper.after_sweep(store, now, 0);
        evicted
    }

    /// The state of `key`, if held (for tests and inspection).
    pub fn state(&self, key: &str) -> Option<ResourceState> {
        key::with_parsed(key, |key| {
            let entry = self.store.states.get(key)?;
            let state = entry.lock().state.clone();
            Some(state)
        })
    }
}

impl MemoryBackend {
    /// Runs the reference transition `f` on the state of the joined `key`.
    fn with_state<R>(
        &self,
        key: &str,
        spec: &LimitSpec,
        f: impl FnOnce(&mut ResourceState, Micros) -> R,
    ) -> R {
        let store = &self.store;
        key::with_parsed(key, |key| {
            store.with_state(key, None, spec, || store.shared_spec(spec), f)
        })
    }

    fn try_acquire_sync(&self, key: &str, spec: &LimitSpec, cost: Cost) -> Decision {
        let lease = store::lease_for(spec);
        self.with_state(key, spec, |s, now| {
            state::try_acquire(s, spec, now, cost, lease)
        })
    }

    fn take_slot_sync(&self, key: &str, spec: &LimitSpec) -> Option<LeaseId> {
        let lease = store::next_lease();
        self.with_state(key, spec, |s, now| state::take_slot(s, spec, now, lease))
            .then_some(lease)
    }

    fn release_sync(&self, key: &str, lease: LeaseId) -> bool {
        key::with_parsed(key, |key| self.store.release(key, lease))
    }
}

#[async_trait]
impl broker_core::Store for MemoryBackend {
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError> {
        Ok(self.try_acquire_sync(key, spec, cost))
    }

    async fn book(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Booking, BackendError> {
        let max_wait = micros(max_wait);
        Ok(self.with_state(key, spec, |s, now| {
            state::book(s, spec, now, cost, max_wait)
        }))
    }

    async fn take_slot(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Result<Option<LeaseId>, BackendError> {
        Ok(self.take_slot_sync(key, spec))
    }

    async fn wait_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        Ok(self.with_state(key, spec, |s, now| state::penalty_left(s, spec, now, cost)))
    }

    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        Ok(self.release_sync(key, lease))
    }

    async fn renew(
        &self,
        key: &str,
        spec: &LimitSpec,
        lease: LeaseId,
    ) -> Result<Renewal, BackendError> {
        // A key with no state holds no lease: none is made for the question.
        let store = &self.store;
        let renewed = key::with_parsed(key, |key| {
            store.with_existing(
                key,
                spec,
                || store.shared_spec(spec),
                |s, now| state::renew(s, spec, now, lease),
            )
        });
        if renewed == Some(true) {
            return Ok(Renewal::Held);
        }
        // Not held: taken again under the same lease if a slot is free.
        let taken = self.with_state(key, spec, |s, now| state::take_slot(s, spec, now, lease));
        Ok(if taken {
            Renewal::Retaken
        } else {
            Renewal::Gone
        })
    }

    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError> {
        self.with_state(key, spec, |s, now| {
            state::settle(s, spec, now, booked, actual, since)
        });
        Ok(())
    }

    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        penalty: Duration,
    ) -> Result<(), BackendError> {
        self.with_state(key, spec, |s, now| {
            state::penalize(s, spec, now, now.saturating_add(micros(penalty)))
        });
        Ok(())
    }

    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError> {
        self.with_state(key, spec, |s, now| state::reconcile(s, spec, now, observed));
        Ok(())
    }

    fn local(&self) -> Option<&dyn LocalStore> {
        Some(self)
    }
}

/// Transitions need no I/O; a lease ends when its permit is released or dropped.
impl LocalStore for MemoryBackend {
    fn try_acquire_now(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Option<Result<Decision, BackendError>> {
        Some(Ok(self.try_acquire_sync(key, spec, cost)))
    }

    fn take_slot_now(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Option<Result<Option<LeaseId>, BackendError>> {
        Some(Ok(self.take_slot_sync(key, spec)))
    }

    fn release_now(&self, key: &str, lease: LeaseId) -> Option<Result<bool, BackendError>> {
        Some(Ok(self.release_sync(key, lease)))
    }

    fn settle_now(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Option<Result<(), BackendError>> {
        self.with_state(key, spec, |s, now| {
            state::settle(s, spec, now, booked, actual, since)
        });
        Some(Ok(()))
    }

    fn states(&self, resource_key: &str, spec: Arc<LimitSpec>) -> Option<Arc<dyn LocalStates>> {
        Some(Arc::new(local::ResourceStates::new(
            self.store.clone(),
            resource_key,
            spec,
        )))
    }
}
