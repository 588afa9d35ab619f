//! A store whose per-resource states call back into the broker from their
//! destructor (a store of the user's own, over `MemoryBackend`): replacing
//! a registration drops the old states outside the registry's lock, so
//! such a call registers instead of waiting on that lock forever.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use broker_core::{
    Backend, BackendError, Cost, Decision, LeaseId, LimitSpec, Limits, LocalStates, ObservedLimit,
    RateLimit, Reservation, ResourceBroker, Verdict,
};
use broker_memory::MemoryBackend;

type DropHook = Arc<dyn Fn() + Send + Sync>;

/// `MemoryBackend`, whose per-resource states run `on_drop` when dropped.
struct Hooked {
    inner: MemoryBackend,
    on_drop: Mutex<Option<DropHook>>,
}

struct HookedStates {
    inner: Arc<dyn LocalStates>,
    on_drop: Option<DropHook>,
}

impl LocalStates for HookedStates {
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Verdict {
        self.inner.try_acquire(sub, cost)
    }
    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool {
        self.inner.release(sub, lease)
    }
}

impl Drop for HookedStates {
    fn drop(&mut self) {
        if let Some(hook) = &self.on_drop {
            hook();
        }
    }
}

#[async_trait]
impl Backend for Hooked {
    async fn try_acquire(&self, k: &str, s: &LimitSpec, c: Cost) -> Result<Decision, BackendError> {
        self.inner.try_acquire(k, s, c).await
    }
    fn try_acquire_now(
        &self,
        k: &str,
        s: &LimitSpec,
        c: Cost,
    ) -> Option<Result<Decision, BackendError>> {
        self.inner.try_acquire_now(k, s, c)
    }
    async fn reserve(
        &self,
        k: &str,
        s: &LimitSpec,
        c: Cost,
        max_wait: Duration,
    ) -> Result<Reservation, BackendError> {
        self.inner.reserve(k, s, c, max_wait).await
    }
    async fn hold_slot(&self, k: &str, s: &LimitSpec) -> Result<Option<LeaseId>, BackendError> {
        self.inner.hold_slot(k, s).await
    }
    async fn release(&self, k: &str, lease: LeaseId) -> Result<bool, BackendError> {
        self.inner.release(k, lease).await
    }
    async fn settle(&self, k: &str, s: &LimitSpec, r: Cost, a: Cost) -> Result<(), BackendError> {
        self.inner.settle(k, s, r, a).await
    }
    async fn penalize(&self, k: &str, s: &LimitSpec, hold: Duration) -> Result<(), BackendError> {
        self.inner.penalize(k, s, hold).await
    }
    async fn reconcile(
        &self,
        k: &str,
        s: &LimitSpec,
        o: &ObservedLimit,
    ) -> Result<(), BackendError> {
        self.inner.reconcile(k, s, o).await
    }
    fn local_states(&self, key: &str, spec: Arc<LimitSpec>) -> Option<Arc<dyn LocalStates>> {
        let inner = self.inner.local_states(key, spec)?;
        let on_drop = self.on_drop.lock().unwrap().clone();
        Some(Arc::new(HookedStates { inner, on_drop }))
    }
}

#[test]
fn states_that_register_from_their_destructor_do_not_deadlock_re_registration() {
    let broker_slot: Arc<Mutex<Option<ResourceBroker>>> = Arc::new(Mutex::new(None));
    let slot = broker_slot.clone();
    let hook: DropHook = Arc::new(move || {
        let broker = slot.lock().unwrap().clone();
        if let Some(broker) = broker {
            broker
                .register_limit("other", Limits::new().rate(RateLimit::per_second(5)))
                .unwrap();
        }
    });
    let store = Hooked {
        inner: MemoryBackend::new(),
        on_drop: Mutex::new(Some(hook)),
    };
    let broker = ResourceBroker::new(store);
    *broker_slot.lock().unwrap() = Some(broker.clone());
    let limits = |n| Limits::new().rate(RateLimit::per_second(n));
    broker.register_limit("r", limits(10)).unwrap();

    // On a thread that has not read the registry, the replaced
    // registration's last reference goes with the registration itself.
    let (done, finished) = std::sync::mpsc::channel();
    let again = broker.clone();
    std::thread::spawn(move || {
        again.register_limit("r", limits(11)).unwrap();
        done.send(()).unwrap();
    });
    let registered = finished.recv_timeout(Duration::from_secs(10));
    *broker_slot.lock().unwrap() = None;
    assert!(registered.is_ok(), "re-registration did not finish");
    assert!(broker.stats().resources.contains_key("other"));
}
