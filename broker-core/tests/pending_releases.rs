//! A permit dropped on a store that needs I/O is released from a task of
//! its own: through the store's [`Releases`] capability when it has one
//! (announced first, without I/O, then sent), by a plain
//! [`Store::release`] when it has none.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use broker_core::store::Releases;
use broker_core::{
    BackendError, Booking, Cost, Decision, Failover, FailurePolicy, LeaseId, LimitSpec, Limits,
    Marks, ObservedLimit, ResourceBroker, Store,
};

/// A store that needs I/O (no local capability) and records the release
/// calls it is made; with the [`Releases`] capability if `pending`.
#[derive(Debug, Default)]
struct Recording {
    pending: bool,
    leases: AtomicU64,
    calls: Calls,
}

/// The release calls a store was made, in order.
type Calls = Arc<Mutex<Vec<(&'static str, LeaseId)>>>;

impl Recording {
    fn note(&self, call: &'static str, lease: LeaseId) {
        self.calls.lock().unwrap().push((call, lease));
    }
}

#[async_trait]
impl Store for Recording {
    async fn try_acquire(&self, _: &str, _: &LimitSpec, _: Cost) -> Result<Decision, BackendError> {
        Ok(Decision::allow(Some(
            self.leases.fetch_add(1, Ordering::SeqCst) + 1,
        )))
    }
    async fn book(
        &self,
        _: &str,
        _: &LimitSpec,
        _: Cost,
        _: Duration,
    ) -> Result<Booking, BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn take_slot(&self, _: &str, _: &LimitSpec) -> Result<Option<LeaseId>, BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn release(&self, _: &str, lease: LeaseId) -> Result<bool, BackendError> {
        self.note("release", lease);
        Ok(true)
    }
    async fn settle(
        &self,
        _: &str,
        _: &LimitSpec,
        _: Cost,
        _: Cost,
        _: Option<Marks>,
    ) -> Result<(), BackendError> {
        Ok(())
    }
    async fn penalize(&self, _: &str, _: &LimitSpec, _: Duration) -> Result<(), BackendError> {
        Ok(())
    }
    async fn reconcile(
        &self,
        _: &str,
        _: &LimitSpec,
        _: &ObservedLimit,
    ) -> Result<(), BackendError> {
        Ok(())
    }
    fn releases(&self) -> Option<&dyn Releases> {
        self.pending.then_some(self as &dyn Releases)
    }
}

#[async_trait]
impl Releases for Recording {
    fn release_sent(&self, _: &str, lease: LeaseId) {
        self.note("sent", lease);
    }
    fn release_unsent(&self, _: &str, lease: LeaseId) {
        self.note("unsent", lease);
    }
    async fn release_announced(&self, _: &str, lease: LeaseId) -> Result<bool, BackendError> {
        self.note("announced", lease);
        Ok(true)
    }
}

/// A broker on a recording store, with one resource of one slot.
fn broker(pending: bool) -> (ResourceBroker, Calls) {
    let store = Recording {
        pending,
        ..Recording::default()
    };
    let calls = store.calls.clone();
    let broker = ResourceBroker::new(store);
    broker
        .register_limit("r", Limits::new().max_concurrent(1))
        .unwrap();
    (broker, calls)
}

/// The calls made, once the release task has made `count` of them.
async fn calls_after(calls: &Calls, count: usize) -> Vec<(&'static str, LeaseId)> {
    for _ in 0..1000 {
        let made = calls.lock().unwrap().clone();
        if made.len() >= count {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Room for a call too many to show.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    calls.lock().unwrap().clone()
}

#[tokio::test]
async fn a_store_without_the_capability_gets_a_plain_release() {
    let (broker, calls) = broker(false);
    let acquired = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(acquired.allowed);
    drop(acquired);
    assert_eq!(calls_after(&calls, 1).await, vec![("release", 1)]);
}

#[tokio::test]
async fn a_store_with_the_capability_is_told_then_sent_its_release() {
    let (broker, calls) = broker(true);
    let acquired = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(acquired.allowed);
    drop(acquired);
    // Told at once, in the dropping caller's line, before the task runs.
    assert_eq!(calls.lock().unwrap().clone(), vec![("sent", 1)]);
    // Sent from the task, then forgotten (the task's end, after the send).
    let made = calls_after(&calls, 3).await;
    assert_eq!(made, vec![("sent", 1), ("announced", 1), ("unsent", 1)]);
}

/// A release task dropped unrun (its runtime shut down) tells the store
/// the release will not come.
#[test]
fn a_release_task_dropped_unrun_is_reported_unsent() {
    let (broker, calls) = broker(true);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let acquired = broker.try_acquire("r", Cost::default()).await.unwrap();
        assert!(acquired.allowed);
        drop(acquired);
    });
    drop(runtime);
    let made = calls.lock().unwrap().clone();
    assert_eq!(made, vec![("sent", 1), ("unsent", 1)]);
}

/// A failover has the capability when its primary has it, forwarding to
/// it, or when it has a local fallback (whose leases it frees at once);
/// otherwise not, and its permits get a plain release.
#[tokio::test]
async fn a_failover_has_the_capability_of_its_primary_or_its_fallback() {
    let store = |pending| Recording {
        pending,
        ..Recording::default()
    };
    let plain = Failover::new(store(false), FailurePolicy::FailOpen).unwrap();
    assert!(plain.releases().is_none());
    let fallback = FailurePolicy::local_fallback(0.5, store(false));
    assert!(Failover::new(store(false), fallback)
        .unwrap()
        .releases()
        .is_some());

    let pending = store(true);
    let calls = pending.calls.clone();
    let failover = Failover::new(pending, FailurePolicy::FailClosed).unwrap();
    let releases = failover.releases().expect("the primary's");
    releases.release_sent("r", 4);
    assert!(releases.release_announced("r", 4).await.unwrap());
    releases.release_unsent("r", 4);
    let made = calls.lock().unwrap().clone();
    assert_eq!(made, vec![("sent", 4), ("announced", 4), ("unsent", 4)]);
}
