//! A permit dropped on a store that needs I/O is released from a task of
//! its own, pending on its key meanwhile: a decision that can take a slot
//! there sends it first; one that could not reach the store is kept and
//! sent again; a task dropped unrun leaves nothing pending.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use broker_core::{
    BackendError, BackendHealth, Booking, Cost, Decision, DenyReason, Failover, FailurePolicy,
    LeaseId, LimitSpec, Limits, Marks, ObservedLimit, ResourceBroker, Store,
};

/// A store that needs I/O (no local capability), holds slots and records
/// the calls it is made; out of reach while `down`.
#[derive(Debug, Default)]
struct Recording {
    leases: AtomicU64,
    held: Mutex<HashSet<LeaseId>>,
    down: Arc<AtomicBool>,
    calls: Calls,
}

/// The calls a store was made, in order.
type Calls = Arc<Mutex<Vec<(&'static str, LeaseId)>>>;

impl Recording {
    fn note(&self, call: &'static str, lease: LeaseId) {
        self.calls.lock().unwrap().push((call, lease));
    }

    fn reach(&self) -> Result<(), BackendError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(BackendError::unavailable("down")),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl Store for Recording {
    async fn try_acquire(&self, _: &str, s: &LimitSpec, _: Cost) -> Result<Decision, BackendError> {
        self.reach()?;
        let mut held = self.held.lock().unwrap();
        if s.max_concurrent.is_some_and(|m| held.len() >= m as usize) {
            self.note("denied", 0);
            return Ok(Decision::deny(DenyReason::Concurrency, 0));
        }
        let lease = self.leases.fetch_add(1, Ordering::SeqCst) + 1;
        held.insert(lease);
        self.note("try_acquire", lease);
        Ok(Decision::allow(Some(lease)))
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
        if let Err(e) = self.reach() {
            self.note("unreached", lease);
            return Err(e);
        }
        self.note("release", lease);
        Ok(self.held.lock().unwrap().remove(&lease))
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
    fn health(&self) -> BackendHealth {
        BackendHealth {
            down: self.down.load(Ordering::SeqCst),
            ..BackendHealth::default()
        }
    }
}

/// A broker on `store`, with one resource of one slot.
fn one_slot(store: impl Store) -> ResourceBroker {
    let broker = ResourceBroker::new(store);
    broker
        .register_limit("r", Limits::new().max_concurrent(1))
        .unwrap();
    broker
}

/// A broker on a recording store, with one resource of one slot.
fn broker() -> (ResourceBroker, Calls, Arc<AtomicBool>) {
    let store = Recording::default();
    let (calls, down) = (store.calls.clone(), store.down.clone());
    (one_slot(store), calls, down)
}

/// The calls made, once `count` of them are.
async fn calls_after(calls: &Calls, count: usize) -> Vec<(&'static str, LeaseId)> {
    for _ in 0..1000 {
        let made = calls.lock().unwrap().clone();
        if made.len() >= count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Room for a call too many to show.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    calls.lock().unwrap().clone()
}

#[tokio::test]
async fn a_dropped_permit_is_released_from_a_task() {
    let (broker, calls, _) = broker();
    let acquired = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(acquired.allowed);
    drop(acquired);
    let made = calls_after(&calls, 2).await;
    assert_eq!(made, vec![("try_acquire", 1), ("release", 1)]);
}

/// A decision on the key of a release still on its way sends it first,
/// so it finds the slot free; the task then sends it no more.
#[tokio::test]
async fn a_decision_sends_the_release_on_its_way_ahead_of_itself() {
    let (broker, calls, _) = broker();
    let acquired = broker.try_acquire("r", Cost::default()).await.unwrap();
    drop(acquired);
    let next = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(next.allowed, "the slot freed just before");
    let made = calls_after(&calls, 3).await;
    let order = vec![("try_acquire", 1), ("release", 1), ("try_acquire", 2)];
    assert_eq!(made, order);
    drop(next);
}

/// A release task dropped unrun (its runtime shut down) leaves nothing
/// pending: the next decision sends nothing ahead (the lease is left to
/// its TTL).
#[test]
fn a_release_task_dropped_unrun_leaves_nothing_pending() {
    let (broker, calls, _) = broker();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    runtime().block_on(async {
        let acquired = broker.try_acquire("r", Cost::default()).await.unwrap();
        assert!(acquired.allowed);
        drop(acquired);
    });
    runtime().block_on(async {
        let next = broker.try_acquire("r", Cost::default()).await.unwrap();
        assert!(!next.allowed);
    });
    let made = calls.lock().unwrap().clone();
    assert_eq!(made, vec![("try_acquire", 1), ("denied", 0)]);
}

/// A release that could not reach the store is kept: sent ahead of the
/// next decision on its key, or, with none, once the store reads up.
#[tokio::test]
async fn a_release_out_of_reach_is_kept_and_sent_again() {
    let (broker, calls, down) = broker();
    let acquired = broker.try_acquire("r", Cost::default()).await.unwrap();
    down.store(true, Ordering::SeqCst);
    drop(acquired);
    assert_eq!(calls_after(&calls, 2).await[1], ("unreached", 1));
    down.store(false, Ordering::SeqCst);
    let next = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(next.allowed, "the kept release went first");
    let made = calls_after(&calls, 4).await;
    assert_eq!(made[2..], [("release", 1), ("try_acquire", 2)]);

    down.store(true, Ordering::SeqCst);
    drop(next);
    assert_eq!(calls_after(&calls, 5).await[4], ("unreached", 2));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(calls.lock().unwrap().len(), 5, "not sent while down");
    down.store(false, Ordering::SeqCst);
    assert_eq!(
        calls_after(&calls, 6).await[5],
        ("release", 2),
        "sent once up"
    );
}

/// Under a local fallback, a lease the fallback granted is freed there,
/// never sent to the primary: the next caller gets the slot.
#[tokio::test]
async fn a_local_fallback_lease_is_freed_in_the_fallback() {
    let primary = Recording::default();
    primary.down.store(true, Ordering::SeqCst);
    let fallback = Recording::default();
    let (to_primary, here) = (primary.calls.clone(), fallback.calls.clone());
    let policy = FailurePolicy::local_fallback(1.0, fallback);
    let broker = one_slot(Failover::new(primary, policy).unwrap());
    let first = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed && first.answered_here);
    drop(first);
    let next = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(next.allowed && next.answered_here, "the slot freed here");
    let made = calls_after(&here, 3).await;
    let order = vec![("try_acquire", 1), ("release", 1), ("try_acquire", 2)];
    assert_eq!(made, order);
    assert!(to_primary.lock().unwrap().is_empty());
}
