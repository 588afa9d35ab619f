//! [`MemoryBackend`]: resource states in a [`dashmap::DashMap`], each behind
//! its own mutex, decided by broker-core's reference transitions; idle states
//! are evicted, and past [`MemoryBackend::max_states`] the least recently used folded.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod eviction;
mod key;
mod spill;
mod store;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use broker_core::clock::micros;
use broker_core::state::{self, ResourceState};
use broker_core::{
    BackendError, Booking, Clock, Cost, Decision, LeaseId, LimitSpec, LocalStates, LocalStore,
    Marks, Micros, ObservedLimit, Renewal,
};
use key::KeyRef;
use store::{lease_for, Store};

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

impl MemoryBackend {
    /// A store on a monotonic clock counting µs since the Unix epoch.
    pub fn new() -> Self {
        Self::with_clock(clock::QuantaClock::new())
    }

    /// A store on `clock` (e.g. [`broker_core::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            store: Arc::new(Store::new(Arc::new(clock))),
        }
    }

    /// Bounds the number of states at `max` (at least 64; 1,048,576 unless set).
    /// Past it the least recently used are folded, never handing a key back more than
    /// it had; states holding a slot or a rate-less penalty, or registered ones, are kept.
    ///
    /// ```
    /// use broker_memory::MemoryBackend;
    /// let backend = MemoryBackend::new().max_states(100_000);
    /// assert_eq!(backend.state_bound(), 100_000);
    /// ```
    pub fn max_states(self, max: usize) -> Self {
        self.store.sweeper.set_max(max);
        self
    }

    /// The bound on the number of states (see [`MemoryBackend::max_states`]).
    pub fn state_bound(&self) -> usize {
        self.store.sweeper.max()
    }

    /// How many states were folded at the bound so far.
    pub fn folded(&self) -> u64 {
        self.store.spills.folded.load(Ordering::Relaxed)
    }

    /// Number of states held now (idle ones not yet evicted included).
    pub fn len(&self) -> usize {
        self.store.map.len()
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
        store.sweeper.sweep(store, store.clock.now(), 0)
    }

    /// The state of `key`, if held (for tests and inspection).
    pub fn state(&self, key: &str) -> Option<ResourceState> {
        key::with_parsed(key, |key| {
            (self.store.map.get(&key as &dyn key::Parts)).map(|e| e.lock().state.clone())
        })
    }

    /// Runs the reference transition `f` on the state of the joined `key`.
    fn with_state<R>(
        &self,
        key: &str,
        spec: &LimitSpec,
        f: impl FnOnce(&mut ResourceState, Micros) -> R,
    ) -> R {
        key::with_parsed(key, |key| self.store.with_state(key, spec, None, f))
    }
}

/// Why every method of the [`LocalStore`] impl answers: no I/O.
const AT_ONCE: &str = "the memory store answers at once";

#[async_trait]
impl broker_core::Store for MemoryBackend {
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError> {
        self.try_acquire_now(key, spec, cost).expect(AT_ONCE)
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
        self.take_slot_now(key, spec).expect(AT_ONCE)
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
        self.release_now(key, lease).expect(AT_ONCE)
    }

    async fn renew(
        &self,
        key: &str,
        spec: &LimitSpec,
        lease: LeaseId,
    ) -> Result<Renewal, BackendError> {
        // One transition: extended if held, else taken again if a slot is free.
        Ok(self.with_state(key, spec, |s, now| {
            if state::renew(s, spec, now, lease) {
                Renewal::Held
            } else if state::take_slot(s, spec, now, lease) {
                Renewal::Retaken
            } else {
                Renewal::Gone
            }
        }))
    }

    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError> {
        (self.settle_now(key, spec, booked, actual, since)).expect(AT_ONCE)
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
        let lease = lease_for(spec);
        Some(Ok(self.with_state(key, spec, |s, now| {
            state::try_acquire(s, spec, now, cost, lease)
        })))
    }

    fn take_slot_now(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Option<Result<Option<LeaseId>, BackendError>> {
        let lease = store::next_lease();
        let taken = self.with_state(key, spec, |s, now| state::take_slot(s, spec, now, lease));
        Some(Ok(taken.then_some(lease)))
    }

    fn release_now(&self, key: &str, lease: LeaseId) -> Option<Result<bool, BackendError>> {
        Some(Ok(key::with_parsed(key, |key| {
            self.store.release(key, lease)
        })))
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
        let resource: Arc<str> = resource_key.into();
        let mut registered = self.store.registered.lock();
        *registered.entry(resource.clone()).or_default() += 1;
        Some(Arc::new(ResourceStates {
            store: self.store.clone(),
            resource,
            spec,
        }))
    }
}

/// The states of one resource, for one registration's limits; the store
/// keeps the resource's own state while a registration lives.
struct ResourceStates {
    store: Arc<Store>,
    spec: Arc<LimitSpec>,
    /// The resource's state key, shared by the keys of the states it makes.
    resource: Arc<str>,
}

impl LocalStates for ResourceStates {
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Decision {
        let (spec, resource) = (&self.spec, &self.resource);
        let lease = lease_for(spec);
        let (key, local) = (KeyRef { resource, sub }, Some((resource, spec)));
        self.store.with_state(key, spec, local, |s, now| {
            state::try_acquire(s, spec, now, cost, lease)
        })
    }

    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool {
        let resource = &self.resource;
        self.store.release(KeyRef { resource, sub }, lease)
    }
}

impl Drop for ResourceStates {
    fn drop(&mut self) {
        let mut registered = self.store.registered.lock();
        if let Some(n) = registered.get_mut(&self.resource) {
            *n -= 1;
            if *n == 0 {
                registered.remove(&self.resource);
            }
        }
    }
}
