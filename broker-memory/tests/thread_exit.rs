//! Calls made while a thread exits, from another thread-local's
//! destructor, after the store's own thread-locals are gone: they are
//! answered as on a live thread (a panic there would abort the process).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::{Cost, LimitSpec, Limits, LocalStore, RateLimit};
use broker_memory::MemoryBackend;

/// Makes a keyed call that creates a new state when dropped, and records
/// whether it was allowed.
struct CallOnDrop {
    store: Arc<MemoryBackend>,
    spec: LimitSpec,
    allowed: Arc<Mutex<Option<bool>>>,
}

impl Drop for CallOnDrop {
    fn drop(&mut self) {
        let answer = self
            .store
            .try_acquire_now("made-while-exiting", &self.spec, Cost::default())
            .and_then(Result::ok)
            .map(|d| d.allowed);
        *self.allowed.lock().unwrap() = answer;
    }
}

thread_local! {
    static ON_EXIT: std::cell::RefCell<Option<CallOnDrop>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn a_keyed_call_from_a_thread_local_destructor_is_answered() {
    let store = Arc::new(MemoryBackend::new());
    let spec = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_second(5)),
        Duration::from_secs(60),
    );
    let allowed = Arc::new(Mutex::new(None));
    let (s, sp, a) = (store.clone(), spec.clone(), allowed.clone());
    std::thread::spawn(move || {
        // Registered before the store's thread-locals are first used, so
        // destroyed after them (destructors run in reverse order).
        ON_EXIT.with(|slot| {
            *slot.borrow_mut() = Some(CallOnDrop {
                store: s.clone(),
                spec: sp.clone(),
                allowed: a,
            })
        });
        // A keyed call that makes a state: the store's thread-locals in use.
        let first = s.try_acquire_now("made-while-running", &sp, Cost::default());
        assert!(first.is_some_and(|d| d.is_ok_and(|d| d.allowed)));
    })
    .join()
    .expect("the thread finished");
    assert_eq!(*allowed.lock().unwrap(), Some(true));
    assert_eq!(store.len(), 2);
}

/// The same through a broker: by id, with a sub-key and on the resource's
/// own state, with a concurrency limit (a permit held and released).
struct AcquireOnDrop {
    broker: broker_core::ResourceBroker,
    answers: Arc<Mutex<Vec<bool>>>,
}

impl Drop for AcquireOnDrop {
    fn drop(&mut self) {
        let targets: [broker_core::Target<'_>; 2] = [("hooks", "tenant-a").into(), "hooks".into()];
        for target in targets {
            let answer = self
                .broker
                .try_acquire_now(target, Cost::default())
                .and_then(Result::ok)
                .is_some_and(|a| a.allowed && a.permit.is_held());
            self.answers.lock().unwrap().push(answer);
        }
    }
}

thread_local! {
    static BROKER_ON_EXIT: std::cell::RefCell<Option<AcquireOnDrop>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn a_broker_call_from_a_thread_local_destructor_is_answered() {
    let broker = broker_core::ResourceBroker::new(MemoryBackend::new());
    let limits = Limits::new()
        .rate(RateLimit::per_second(5))
        .max_concurrent(1);
    broker.register_limit("hooks", limits).unwrap();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let (b, a) = (broker.clone(), answers.clone());
    std::thread::spawn(move || {
        BROKER_ON_EXIT.with(|slot| {
            *slot.borrow_mut() = Some(AcquireOnDrop {
                broker: b.clone(),
                answers: a,
            })
        });
        // The broker's and the store's thread-locals in use, then released.
        let first = b.try_acquire_now(("hooks", "tenant-b"), Cost::default());
        assert!(first.is_some_and(|a| a.is_ok_and(|a| a.allowed)));
    })
    .join()
    .expect("the thread finished");
    assert_eq!(*answers.lock().unwrap(), vec![true, true]);
    // Both permits were released as the destructor's answers dropped.
    let again = broker.try_acquire_now("hooks", Cost::default());
    assert!(again.is_some_and(|a| a.is_ok_and(|a| a.allowed)));
}
