//! The failure policy above the stores: a `Failover` over any primary that
//! is out of reach answers by its policy, with the local fallback in a
//! memory store of this process.

use std::time::Duration;

use broker_core::{
    BrokerError, Cost, Failover, FailurePolicy, Limits, ManualClock, RateLimit, ResourceBroker,
};
use broker_memory::MemoryBackend;
use broker_testkit::DownBackend;

fn broker_over_a_down_store(policy: FailurePolicy) -> ResourceBroker {
    let store = Failover::new(DownBackend::unreachable("connection refused"), policy).unwrap();
    ResourceBroker::new(store)
}

fn ten_a_second() -> Limits {
    Limits::new().rate(RateLimit::per_second(10).with_burst(10))
}

#[tokio::test]
async fn fail_closed_refuses_with_the_stores_error() {
    let broker = broker_over_a_down_store(FailurePolicy::FailClosed);
    broker.register_limit("api", ten_a_second()).unwrap();
    match broker.try_acquire("api", Cost::default()).await {
        Err(BrokerError::Backend(e)) => {
            assert!(e.is_unavailable(), "{e}");
            assert!(e.message.contains("fail-closed"), "{e}");
            assert!(e.message.contains("connection refused"), "{e}");
        }
        other => panic!("refused, got {other:?}"),
    }
}

#[tokio::test]
async fn fail_open_allows_every_call_marked_as_answered_here() {
    let broker = broker_over_a_down_store(FailurePolicy::FailOpen);
    broker
        .register_limit("api", ten_a_second().max_concurrent(1))
        .unwrap();
    for _ in 0..20 {
        let a = broker.try_acquire("api", Cost::default()).await.unwrap();
        assert!(a.allowed && a.answered_here);
    }
}

/// The local fallback holds `share` of every limit in the fallback store:
/// 5 of a burst of 10, then a denial with a wait; a slot of 2 at half is
/// one, freed in the fallback when its permit ends.
#[tokio::test]
async fn the_local_fallback_decides_in_its_store_at_its_share() {
    let clock = ManualClock::new();
    let policy = FailurePolicy::local_fallback(0.5, MemoryBackend::with_clock(clock.clone()));
    let broker = broker_over_a_down_store(policy);
    broker.register_limit("api", ten_a_second()).unwrap();
    for _ in 0..5 {
        let a = broker.try_acquire("api", Cost::default()).await.unwrap();
        assert!(a.allowed && a.answered_here);
    }
    let denied = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(!denied.allowed && denied.answered_here);
    assert!(denied.wait_time > Duration::ZERO);

    broker
        .register_limit("slots", Limits::new().max_concurrent(2))
        .unwrap();
    let first = broker.try_acquire("slots", Cost::default()).await.unwrap();
    assert!(first.allowed);
    let second = broker.try_acquire("slots", Cost::default()).await.unwrap();
    assert!(!second.allowed, "half of 2 slots is one");
    drop(first);
    let third = broker.try_acquire("slots", Cost::default()).await.unwrap();
    assert!(third.allowed, "the slot was freed in the fallback");
}

/// A limit too small to split by the share admits nothing locally, with an
/// error that says so.
#[tokio::test]
async fn a_limit_too_small_for_the_share_is_refused_with_a_clear_error() {
    let policy = FailurePolicy::local_fallback(0.5, MemoryBackend::new());
    let broker = broker_over_a_down_store(policy);
    broker
        .register_limit("one", Limits::new().rate(RateLimit::per_minute(1)))
        .unwrap();
    let e = broker
        .try_acquire("one", Cost::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("admits nothing"), "{e}");
}

/// Only an outage is the policy's: any other error of the store (a script
/// error, a bad key) is returned as it is, under every policy.
#[tokio::test]
async fn an_error_that_is_not_an_outage_is_returned_as_is() {
    let store = Failover::new(DownBackend::new("WRONGTYPE"), FailurePolicy::FailOpen).unwrap();
    let broker = ResourceBroker::new(store);
    broker.register_limit("api", ten_a_second()).unwrap();
    let e = broker
        .try_acquire("api", Cost::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
}

#[test]
fn a_share_outside_zero_to_one_is_refused() {
    for share in [0.0, -1.0, 1.5, f64::NAN] {
        let policy = FailurePolicy::local_fallback(share, MemoryBackend::new());
        let e = Failover::new(DownBackend::unreachable("down"), policy).unwrap_err();
        assert!(e.message.contains("share"), "{e}");
    }
    let policy = FailurePolicy::local_fallback(1.0, MemoryBackend::new());
    assert!(Failover::new(DownBackend::unreachable("down"), policy).is_ok());
}
