//! `try_acquire(..).now_or_never()`: the futures of `try_acquire` answer
//! one poll as `.await` would (in the caller's line on the in-memory store),
//! a call still pending on its store gives `None`, and a store that answers
//! on the first poll without a synchronous form answers as well.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{
    Acquisition, BrokerError, Cost, DenyReason, Limits, LocalStates, ManualClock, RateLimit,
    ResourceBroker,
};
use broker_memory::MemoryBackend;
use broker_testkit::{Hooks, Wrapped};
use futures::FutureExt;

/// A store that must be asked asynchronously (see [`Hooks::asynchronous`]).
struct Asynchronous;

impl Hooks for Asynchronous {
    fn asynchronous(&self) -> bool {
        true
    }
    fn local_states(&self, _: Arc<dyn LocalStates>) -> Option<Arc<dyn LocalStates>> {
        None
    }
}

fn limits() -> Limits {
    Limits::new().rate(RateLimit::per_second(2).with_burst(2))
}

fn answer(a: Option<Result<Acquisition, BrokerError>>) -> (bool, Duration, Option<DenyReason>) {
    let a = a
        .expect("the in-memory store answers on the first poll")
        .unwrap();
    (a.allowed, a.wait_time, a.denied_by)
}

#[test]
fn the_in_memory_store_answers_by_id_and_through_a_handle() {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(ManualClock::new()));
    broker.register_limit("tenants", limits()).unwrap();
    let handle = broker.resource_handle("tenants").unwrap();
    let by_id = || {
        broker
            .try_acquire(("tenants", "acme"), Cost::default())
            .now_or_never()
    };
    let allowed = (true, Duration::ZERO, None);
    assert_eq!(answer(by_id()), allowed);
    assert_eq!(
        answer(handle.try_acquire("acme", Cost::default()).now_or_never()),
        allowed
    );
    let denied = (false, Duration::from_millis(500), Some(DenyReason::Rate));
    assert_eq!(answer(by_id()), denied);
    assert_eq!(
        answer(handle.try_acquire("acme", Cost::default()).now_or_never()),
        denied
    );
    assert_eq!(
        answer(handle.try_acquire("other", Cost::default()).now_or_never()),
        allowed,
        "each sub-key has its own state"
    );
    let unknown = broker.try_acquire("nope", Cost::default()).now_or_never();
    assert!(matches!(
        unknown,
        Some(Err(BrokerError::UnknownResource(id))) if id == "nope"
    ));
    let unfit = handle.try_acquire("acme", Cost::requests(3)).now_or_never();
    assert!(
        matches!(unfit, Some(Err(BrokerError::CostNeverFits { .. }))),
        "{unfit:?}"
    );
}

#[tokio::test]
async fn a_call_that_waits_for_its_store_gives_none_and_consumes_nothing() {
    let store = Arc::new(MemoryBackend::with_clock(ManualClock::new()));
    let broker = ResourceBroker::new(Wrapped::new(store, Asynchronous));
    broker.register_limit("tenants", limits()).unwrap();
    let handle = broker.resource_handle("tenants").unwrap();
    for _ in 0..3 {
        assert!(broker
            .try_acquire(("tenants", "acme"), Cost::default())
            .now_or_never()
            .is_none());
        assert!(handle
            .try_acquire("acme", Cost::default())
            .now_or_never()
            .is_none());
    }
    // The whole burst is still there, awaited.
    for _ in 0..2 {
        let a = handle.try_acquire("acme", Cost::default()).await.unwrap();
        assert!(a.allowed);
    }
    let a = broker
        .try_acquire(("tenants", "acme"), Cost::default())
        .await
        .unwrap();
    assert_eq!(a.denied_by, Some(DenyReason::Rate));
}

/// A store with no synchronous form whose call completes on its first poll
/// (here, one that is down) answers through `now_or_never` as well, as one
/// poll of the future does.
#[test]
fn a_store_that_answers_on_the_first_poll_answers() {
    let broker = ResourceBroker::new(broker_testkit::DownBackend::new("down"));
    broker.register_limit("tenants", limits()).unwrap();
    let answer = broker
        .try_acquire(("tenants", "acme"), Cost::default())
        .now_or_never();
    assert!(
        matches!(answer, Some(Err(BrokerError::Backend(_)))),
        "{answer:?}"
    );
}

/// `ResourceHandle::try_acquire_now`: counted as `try_acquire` counts it,
/// the slot of a leased answer in its permit, an error (uncounted) for a
/// cost that never fits, and `None` with nothing consumed or counted where
/// the store needs I/O.
#[tokio::test]
async fn the_synchronous_answer_counts_and_takes_slots_as_the_future_does() {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(ManualClock::new()));
    broker
        .register_limit("tenants", limits().max_concurrent(1))
        .unwrap();
    let handle = broker.resource_handle("tenants").unwrap();
    let now = |cost| handle.try_acquire_now("acme", cost).expect("in process");
    let mut first = now(Cost::default()).unwrap();
    assert!(first.allowed && first.permit.is_held(), "{first:?}");
    // The slot is held: the next one is denied by the concurrency limit.
    let second = now(Cost::default()).unwrap();
    assert_eq!(second.denied_by, Some(DenyReason::Concurrency));
    assert!(!second.permit.is_held());
    assert!(matches!(
        now(Cost::requests(3)),
        Err(BrokerError::CostNeverFits { .. })
    ));
    first.permit.release();
    let second = now(Cost::default()).unwrap();
    assert!(second.allowed && second.permit.is_held(), "{second:?}");
    let third = now(Cost::default()).unwrap();
    assert!(!third.allowed, "{third:?}");
    let stats = broker.stats();
    let tenants = stats.resources.get("tenants").expect("registered");
    assert_eq!((tenants.allowed, tenants.denied), (2, 2));
    drop(second);

    // A store that needs I/O: no answer at once, nothing consumed.
    let store = Arc::new(MemoryBackend::with_clock(ManualClock::new()));
    let broker = ResourceBroker::new(Wrapped::new(store, Asynchronous));
    broker.register_limit("tenants", limits()).unwrap();
    let handle = broker.resource_handle("tenants").unwrap();
    for _ in 0..3 {
        assert!(handle.try_acquire_now("acme", Cost::default()).is_none());
    }
    for _ in 0..2 {
        assert!(
            handle
                .try_acquire("acme", Cost::default())
                .await
                .unwrap()
                .allowed
        );
    }
}
