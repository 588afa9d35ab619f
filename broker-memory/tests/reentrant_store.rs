//! A store whose per-resource states call back into the broker (a store
//! of the user's own, over `MemoryBackend`), from their destructor or as
//! they are made: replacing a registration drops the old states, and a
//! registration asks for its states, outside the registry's lock, so such
//! a call registers instead of waiting on that lock forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::{
    Cost, Decision, LeaseId, Limits, LocalStates, OnOtherLimits, RateLimit, ResourceBroker,
};
use broker_memory::MemoryBackend;
use broker_testkit::{Hooks, Wrapped};

type DropHook = Arc<dyn Fn() + Send + Sync>;

/// Hands out per-resource states that run `on_drop` when dropped.
struct OnDrop(Mutex<Option<DropHook>>);

struct HookedStates {
    inner: Arc<dyn LocalStates>,
    on_drop: Option<DropHook>,
}

impl LocalStates for HookedStates {
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Decision {
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

impl Hooks for OnDrop {
    fn local_states(&self, inner: Arc<dyn LocalStates>) -> Option<Arc<dyn LocalStates>> {
        let on_drop = self.0.lock().unwrap().clone();
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
    let store = Wrapped::new(
        Arc::new(MemoryBackend::new()),
        OnDrop(Mutex::new(Some(hook))),
    );
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

/// Registers a companion resource when it is asked for a resource's
/// states: the first time, or, with `every_time`, every time but from
/// within its own registration.
struct RegistersCompanion {
    broker: Arc<Mutex<Option<ResourceBroker>>>,
    done: AtomicBool,
    every_time: bool,
}

impl Hooks for RegistersCompanion {
    fn local_states(&self, inner: Arc<dyn LocalStates>) -> Option<Arc<dyn LocalStates>> {
        let broker = self.broker.lock().unwrap().clone();
        if let Some(broker) = broker {
            if !self.done.swap(true, Ordering::SeqCst) {
                broker
                    .register_limit("companion", Limits::new().rate(RateLimit::per_second(5)))
                    .unwrap();
                if self.every_time {
                    self.done.store(false, Ordering::SeqCst);
                }
            }
        }
        Some(inner)
    }
}

/// A broker over a store whose states register a companion resource (see
/// [`RegistersCompanion`]), and whether `register` on it finished within
/// 10 s.
fn finishes(
    every_time: bool,
    register: impl FnOnce(&ResourceBroker) + Send + 'static,
) -> (bool, ResourceBroker) {
    let slot: Arc<Mutex<Option<ResourceBroker>>> = Arc::default();
    let store = Wrapped::new(
        Arc::new(MemoryBackend::new()),
        RegistersCompanion {
            broker: slot.clone(),
            done: AtomicBool::new(false),
            every_time,
        },
    );
    let broker = ResourceBroker::new(store);
    *slot.lock().unwrap() = Some(broker.clone());
    let (done, finished) = std::sync::mpsc::channel();
    let b = broker.clone();
    std::thread::spawn(move || {
        register(&b);
        done.send(()).unwrap();
    });
    let registered = finished.recv_timeout(Duration::from_secs(10));
    *slot.lock().unwrap() = None;
    (registered.is_ok(), broker)
}

#[test]
fn states_made_for_a_registration_may_register_another_resource() {
    let (finished, broker) = finishes(false, |b| {
        b.register_limit("r", Limits::new().rate(RateLimit::per_second(10)))
            .unwrap()
    });
    assert!(finished, "the registration did not finish");
    assert!(broker.limits("r").is_ok() && broker.limits("companion").is_ok());
}

/// A batch registration is decided under the registry's lock on what is
/// there then: states that register a resource each time they are made
/// do not keep it from finishing.
#[test]
fn a_batch_finishes_beside_states_that_register_every_time() {
    let (finished, broker) = finishes(true, |b| {
        let limits = Limits::new().rate(RateLimit::per_second(10));
        b.register_limits(&[("r", &limits), ("s", &limits)], OnOtherLimits::Refuse)
            .unwrap()
    });
    assert!(finished, "the batch did not finish");
    assert!(broker.limits("r").is_ok() && broker.limits("s").is_ok());
}
