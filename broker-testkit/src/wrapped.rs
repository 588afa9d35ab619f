//! [`Wrapped`]: a state store that passes every call on to another one,
//! except where the test's [`Hooks`] step in (a transition that fails on
//! demand, a store that calls a broker from within a decision, states that
//! call back from their destructor, a store without per-resource states).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use broker_core::stats::BackendHealth;
use broker_core::{
    BackendError, Booking, Cost, Decision, LeaseId, LimitSpec, LocalStates, LocalStore, Marks,
    ObservedLimit, Renewal, Store,
};

/// What a [`Wrapped`] store does besides passing each call on. Every hook
/// defaults to passing the call on unchanged.
pub trait Hooks: Send + Sync + 'static {
    /// Runs before each synchronous keyed `try_acquire`.
    fn before_try_acquire_now(&self) {}

    /// Whether the store answers `try_acquire` only asynchronously, as a
    /// store that needs I/O: its synchronous `try_acquire_now` says it
    /// cannot (`None`), and its asynchronous `try_acquire` is pending on
    /// its first poll (it wakes its task at once) before it passes the
    /// call on.
    fn asynchronous(&self) -> bool {
        false
    }

    /// The answer an asynchronous `try_acquire` on `key` gives instead of
    /// the wrapped store's (`None`: the wrapped store's), asked before the
    /// call is passed on.
    fn try_acquire(&self, _key: &str) -> Option<Result<Decision, BackendError>> {
        None
    }

    /// How long an asynchronous `try_acquire` on `key` waits before it is
    /// passed on (a decision across a network).
    fn try_acquire_delay(&self, _key: &str) -> Duration {
        Duration::ZERO
    }

    /// How long an asynchronous `try_acquire` on `key` waits after the
    /// wrapped store has decided it, before it answers (a reply across a
    /// network: the store has decided, the caller does not know yet).
    fn try_acquire_reply_delay(&self, _key: &str) -> Duration {
        Duration::ZERO
    }

    /// How long a `take_slot` on `key` waits after the wrapped store has
    /// taken the slot (or found none), before it answers (a reply across a
    /// network: the store holds the lease, the caller does not know it
    /// yet); while it is non-zero, `take_slot_now` cannot answer in
    /// process.
    fn take_slot_reply_delay(&self, _key: &str) -> Duration {
        Duration::ZERO
    }

    /// The answer a `settle` on `key` of a booking marked `since` gives
    /// instead of the wrapped store's (`None`: the wrapped store's).
    fn settle(&self, _key: &str, _since: Option<Marks>) -> Option<Result<(), BackendError>> {
        None
    }

    /// The health the store reports, given the wrapped store's.
    fn health(&self, inner: BackendHealth) -> BackendHealth {
        inner
    }

    /// How long a `renew` waits before it is passed on (the time between
    /// the renewing task's pick of a lease and its renewal's arrival).
    fn renew_delay(&self) -> Duration {
        Duration::ZERO
    }

    /// How long a `settle` or a `penalize` waits before it is passed on
    /// (a store across a network); while it is non-zero, `settle_now`
    /// cannot answer in process.
    fn correction_delay(&self) -> Duration {
        Duration::ZERO
    }

    /// The answer `penalize` gives instead of the wrapped store's
    /// (`None`: the wrapped store's).
    fn penalize(&self) -> Option<Result<(), BackendError>> {
        None
    }

    /// The answer `reconcile` gives instead of the wrapped store's.
    fn reconcile(&self) -> Option<Result<(), BackendError>> {
        None
    }

    /// How long a `reconcile` waits before it is passed on (a store
    /// across a network).
    fn reconcile_delay(&self) -> Duration {
        Duration::ZERO
    }

    /// The per-resource states handed out in place of the wrapped store's
    /// `states` (`None`: none, as a store that needs I/O).
    fn local_states(&self, states: Arc<dyn LocalStates>) -> Option<Arc<dyn LocalStates>> {
        Some(states)
    }
}

/// A store that passes every call on to `inner`, except where `hooks`
/// step in.
pub struct Wrapped<H> {
    /// The store the calls go to.
    pub inner: Arc<dyn Store>,
    /// Where the test steps in.
    pub hooks: H,
}

impl<H: Hooks> Wrapped<H> {
    /// `inner` with `hooks`.
    pub fn new(inner: Arc<dyn Store>, hooks: H) -> Self {
        Self { inner, hooks }
    }
}

#[async_trait]
impl<H: Hooks> Store for Wrapped<H> {
    async fn try_acquire(&self, k: &str, s: &LimitSpec, c: Cost) -> Result<Decision, BackendError> {
        if self.hooks.asynchronous() {
            let mut polled = false;
            std::future::poll_fn(|cx| match std::mem::replace(&mut polled, true) {
                true => std::task::Poll::Ready(()),
                false => {
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }
            })
            .await;
        }
        pause(self.hooks.try_acquire_delay(k)).await;
        if let Some(answer) = self.hooks.try_acquire(k) {
            return answer;
        }
        let answer = self.inner.try_acquire(k, s, c).await;
        pause(self.hooks.try_acquire_reply_delay(k)).await;
        answer
    }
    async fn book(
        &self,
        k: &str,
        s: &LimitSpec,
        c: Cost,
        w: Duration,
    ) -> Result<Booking, BackendError> {
        self.inner.book(k, s, c, w).await
    }
    async fn wait_left(
        &self,
        k: &str,
        s: &LimitSpec,
        c: Cost,
    ) -> Result<broker_core::Micros, BackendError> {
        self.inner.wait_left(k, s, c).await
    }
    async fn take_slot(&self, k: &str, s: &LimitSpec) -> Result<Option<LeaseId>, BackendError> {
        let answer = self.inner.take_slot(k, s).await;
        pause(self.hooks.take_slot_reply_delay(k)).await;
        answer
    }
    async fn release(&self, k: &str, l: LeaseId) -> Result<bool, BackendError> {
        self.inner.release(k, l).await
    }
    async fn renew(&self, k: &str, s: &LimitSpec, l: LeaseId) -> Result<Renewal, BackendError> {
        pause(self.hooks.renew_delay()).await;
        self.inner.renew(k, s, l).await
    }
    async fn settle(
        &self,
        k: &str,
        s: &LimitSpec,
        r: Cost,
        a: Cost,
        b: Option<Marks>,
    ) -> Result<(), BackendError> {
        pause(self.hooks.correction_delay()).await;
        match self.hooks.settle(k, b) {
            Some(answer) => answer,
            None => self.inner.settle(k, s, r, a, b).await,
        }
    }
    async fn penalize(&self, k: &str, s: &LimitSpec, h: Duration) -> Result<(), BackendError> {
        pause(self.hooks.correction_delay()).await;
        match self.hooks.penalize() {
            Some(answer) => answer,
            None => self.inner.penalize(k, s, h).await,
        }
    }
    async fn reconcile(
        &self,
        k: &str,
        s: &LimitSpec,
        o: &ObservedLimit,
    ) -> Result<(), BackendError> {
        match self.hooks.reconcile() {
            Some(answer) => answer,
            None => {
                pause(self.hooks.reconcile_delay()).await;
                self.inner.reconcile(k, s, o).await
            }
        }
    }
    fn health(&self) -> BackendHealth {
        self.hooks.health(self.inner.health())
    }
    fn local(&self) -> Option<&dyn LocalStore> {
        self.inner.local().map(|_| self as &dyn LocalStore)
    }
    fn turns(&self) -> Option<&dyn broker_core::store::Turns> {
        self.inner.turns()
    }
}

/// The wrapped store's synchronous capability, where the hooks let it
/// answer.
impl<H: Hooks> LocalStore for Wrapped<H> {
    fn try_acquire_now(
        &self,
        k: &str,
        s: &LimitSpec,
        c: Cost,
    ) -> Option<Result<Decision, BackendError>> {
        self.hooks.before_try_acquire_now();
        if self.hooks.asynchronous() {
            return None;
        }
        self.inner.local()?.try_acquire_now(k, s, c)
    }

    fn take_slot_now(
        &self,
        k: &str,
        s: &LimitSpec,
    ) -> Option<Result<Option<LeaseId>, BackendError>> {
        if !self.hooks.take_slot_reply_delay(k).is_zero() {
            return None;
        }
        self.inner.local()?.take_slot_now(k, s)
    }

    fn release_now(&self, k: &str, l: LeaseId) -> Option<Result<bool, BackendError>> {
        self.inner.local()?.release_now(k, l)
    }

    fn settle_now(
        &self,
        k: &str,
        s: &LimitSpec,
        r: Cost,
        a: Cost,
        b: Option<Marks>,
    ) -> Option<Result<(), BackendError>> {
        if !self.hooks.correction_delay().is_zero() {
            return None;
        }
        match self.hooks.settle(k, b) {
            Some(answer) => Some(answer),
            None => self.inner.local()?.settle_now(k, s, r, a, b),
        }
    }

    fn states(&self, key: &str, spec: Arc<LimitSpec>) -> Option<Arc<dyn LocalStates>> {
        self.hooks
            .local_states(self.inner.local()?.states(key, spec)?)
    }
}

/// Waits `delay` (a hook's), without a timer when it is zero.
async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}
