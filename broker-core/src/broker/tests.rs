//! Tests of the broker's registry and resource record.

use std::sync::Arc;
use std::time::Duration;

use super::ResourceBroker;
use crate::error::BackendError;
use crate::limits::RateLimit;
use crate::limits::{Cost, Limits};
use crate::observed::ObservedLimit;
use crate::state::Decision;
use crate::state::LimitSpec;
use crate::store::Store;

#[derive(Debug)]
pub(crate) struct NoStore;

#[async_trait::async_trait]
impl Store for NoStore {
    async fn try_acquire(&self, _: &str, _: &LimitSpec, _: Cost) -> Result<Decision, BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn book(
        &self,
        _: &str,
        _: &LimitSpec,
        _: Cost,
        _: Duration,
    ) -> Result<crate::state::Booking, BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn take_slot(
        &self,
        _: &str,
        _: &LimitSpec,
    ) -> Result<Option<crate::state::LeaseId>, BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn release(&self, _: &str, _: crate::state::LeaseId) -> Result<bool, BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn settle(
        &self,
        _: &str,
        _: &LimitSpec,
        _: Cost,
        _: Cost,
        _: Option<crate::state::Marks>,
    ) -> Result<(), BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn penalize(&self, _: &str, _: &LimitSpec, _: Duration) -> Result<(), BackendError> {
        Err(BackendError::new("unused"))
    }
    async fn reconcile(
        &self,
        _: &str,
        _: &LimitSpec,
        _: &ObservedLimit,
    ) -> Result<(), BackendError> {
        Err(BackendError::new("unused"))
    }
}

/// A service that re-configures a resource again and again (a config
/// reload every second for a day) while something made on its first
/// registration lives on (a layer's [`ResourceHandle`], a long-held
/// permit, a thread's kept registry) keeps that one and the latest
/// alive, not every registration in between.
#[test]
fn re_registrations_are_not_kept_alive_by_an_old_one() {
    let broker = ResourceBroker::new(NoStore);
    let limits = |n| Limits::new().rate(RateLimit::per_second(n));
    broker.register_limit("r", limits(1)).unwrap();
    let first = broker.resource_handle("r").unwrap();
    let registrations: Vec<_> = (0..10_000u64)
        .map(|i| {
            broker.register_limit("r", limits(2 + i % 2)).unwrap();
            Arc::downgrade(&broker.resource("r").unwrap())
        })
        .collect();
    let alive = registrations
        .iter()
        .filter(|r| r.strong_count() > 0)
        .count();
    assert_eq!(alive, 1, "only the latest, besides the first");
    assert!(!first.is_current());
}
