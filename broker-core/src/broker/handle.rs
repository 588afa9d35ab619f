//! [`ResourceHandle`]: one registered resource, for callers that check the
//! same resource on every request.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::calls::On;
use super::{Acquisition, Permit, Resource, ResourceBroker, TryAcquire};
use crate::error::BrokerError;
use crate::limits::Cost;
use crate::state::Verdict;

/// One registered resource of a [`ResourceBroker`], looked up once: its
/// calls answer exactly as the broker's on the same id, and follow a
/// re-registration of it. Cloning is cheap.
///
/// ```
/// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
/// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
/// let broker = ResourceBroker::new(backend);
/// broker.register_limit("tenants", Limits::new().rate(RateLimit::per_second(100)))?;
/// let tenants = broker.resource_handle("tenants")?;
/// // One tenant's own state ...
/// if let Some(answer) = tenants.try_acquire_now("acme", Cost::default()) {
///     println!("acme allowed: {}", answer?.allowed);
/// }
/// // ... or the resource's whole state.
/// let _ = tenants.try_acquire_now(None, Cost::default());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ResourceHandle {
    broker: ResourceBroker,
    resource: Arc<Resource>,
}

impl std::fmt::Debug for ResourceHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceHandle")
            .field("resource", &self.resource.id)
            .finish()
    }
}

impl ResourceBroker {
    /// A handle on the registered `resource` (see [`ResourceHandle`]).
    /// Unknown resource: [`BrokerError::UnknownResource`].
    ///
    /// ```
    /// use broker_core::{BrokerError, Limits, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(10)))?;
    /// assert_eq!(broker.resource_handle("webhooks")?.resource(), "webhooks");
    /// assert!(matches!(broker.resource_handle("nope"), Err(BrokerError::UnknownResource(_))));
    /// # Ok(()) }
    /// ```
    pub fn resource_handle(&self, resource: &str) -> Result<ResourceHandle, BrokerError> {
        Ok(ResourceHandle {
            broker: self.clone(),
            resource: self.resource(resource)?,
        })
    }
}

impl ResourceHandle {
    /// The resource id.
    pub fn resource(&self) -> &str {
        &self.resource.id
    }

    /// Whether the registration this handle was made on is still the
    /// resource's: false once the id has been registered again.
    pub fn is_current(&self) -> bool {
        !self.resource.retired.load(Ordering::Acquire)
    }

    /// Where this handle's calls go: its registration while it is current.
    fn on(&self) -> On<'_> {
        match self.is_current() {
            true => On::Resource(&self.resource),
            false => On::Id(&self.resource.id),
        }
    }

    /// [`ResourceBroker::try_acquire`] on this resource: `key` is a sub-key
    /// (`"acme"`, `Some(tenant)`) or `None` for the resource's own state.
    ///
    /// ```
    /// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
    /// # async fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("tenants", Limits::new().rate(RateLimit::per_second(100)))?;
    /// let tenants = broker.resource_handle("tenants")?;
    /// let a = tenants.try_acquire("acme", Cost::default()).await?;
    /// if !a.allowed {
    ///     println!("429, retry after {:?}", a.wait_time);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire<'s, 'a: 's>(
        &'s self,
        key: impl Into<Option<&'a str>>,
        cost: Cost,
    ) -> TryAcquire<'s> {
        TryAcquire::new(&self.broker, self.on(), key.into(), cost)
    }

    /// The compact hot-path answer: the [`Verdict`] when the store answers in
    /// process and the cost fits, a [`Verdict::Leased`]'s slot put in `permit`.
    /// Else `None`, nothing consumed: `try_acquire_now` gives the full answer.
    ///
    /// ```
    /// use broker_core::{Cost, Limits, Permit, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("tenants", Limits::new().rate(RateLimit::per_second(100)))?;
    /// let tenants = broker.resource_handle("tenants")?;
    /// let mut permit = Permit::empty();
    /// match tenants.verdict_now(Some("acme"), Cost::default(), &mut permit) {
    ///     Some(v) if v.allowed() => println!("admitted"),
    ///     Some(v) => println!("denied: {v:?}"),
    ///     None => println!("{:?}", tenants.try_acquire_now("acme", Cost::default())),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn verdict_now(
        &self,
        key: Option<&str>,
        cost: Cost,
        permit: &mut Permit,
    ) -> Option<Verdict> {
        let verdict = self.on().with(&self.broker, |resource| {
            resource.check_fits(cost).ok()?;
            self.broker.quick(resource, key, cost, permit)
        });
        verdict.ok().flatten()
    }

    /// [`ResourceBroker::try_acquire_now`] on this resource: `None` when the
    /// store must be asked asynchronously (nothing was consumed).
    ///
    /// ```
    /// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("tenants", Limits::new().rate(RateLimit::per_second(100)))?;
    /// match broker.resource_handle("tenants")?.try_acquire_now("acme", Cost::default()) {
    ///     Some(answer) => println!("allowed: {}", answer?.allowed),
    ///     None => println!("ask with try_acquire(..).await"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire_now<'a>(
        &self,
        key: impl Into<Option<&'a str>>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        self.broker.acquire_now_on(self.on(), key.into(), cost)
    }
}
