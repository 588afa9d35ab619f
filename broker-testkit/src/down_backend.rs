//! A state store that is always down, for testing what the broker and the
//! layers do with a backend error the failure policy did not absorb.

use std::time::Duration;

use async_trait::async_trait;
use broker_core::{
    BackendError, Booking, Cost, Decision, LeaseId, LimitSpec, Marks, ObservedLimit, Store,
};

/// Every call fails with [`DownBackend::message`].
#[derive(Debug, Clone)]
pub struct DownBackend {
    /// The error message every call returns.
    pub message: &'static str,
    /// Whether the error says the store is unreachable
    /// ([`BackendError::is_unavailable`]), which a failure policy answers.
    pub unreachable: bool,
}

impl DownBackend {
    /// A store whose every call fails with `message`.
    pub fn new(message: &'static str) -> Self {
        Self {
            message,
            unreachable: false,
        }
    }

    /// A store whose every call fails with `message` as an "unavailable"
    /// error, as a shared store out of reach does.
    pub fn unreachable(message: &'static str) -> Self {
        Self {
            message,
            unreachable: true,
        }
    }

    fn fail<T>(&self) -> Result<T, BackendError> {
        Err(match self.unreachable {
            true => BackendError::unavailable(self.message),
            false => BackendError::new(self.message),
        })
    }
}

#[async_trait]
impl Store for DownBackend {
    async fn try_acquire(&self, _: &str, _: &LimitSpec, _: Cost) -> Result<Decision, BackendError> {
        self.fail()
    }
    async fn book(
        &self,
        _: &str,
        _: &LimitSpec,
        _: Cost,
        _: Duration,
    ) -> Result<Booking, BackendError> {
        self.fail()
    }
    async fn take_slot(&self, _: &str, _: &LimitSpec) -> Result<Option<LeaseId>, BackendError> {
        self.fail()
    }
    async fn release(&self, _: &str, _: LeaseId) -> Result<bool, BackendError> {
        self.fail()
    }
    async fn settle(
        &self,
        _: &str,
        _: &LimitSpec,
        _: Cost,
        _: Cost,
        _: Option<Marks>,
    ) -> Result<(), BackendError> {
        self.fail()
    }
    async fn penalize(&self, _: &str, _: &LimitSpec, _: Duration) -> Result<(), BackendError> {
        self.fail()
    }
    async fn reconcile(
        &self,
        _: &str,
        _: &LimitSpec,
        _: &ObservedLimit,
    ) -> Result<(), BackendError> {
        self.fail()
    }
}
