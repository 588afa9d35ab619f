//! [`ResourceHandle`]: one registered resource, for callers that check the
//! same resource on every request.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::calls::On;
use super::{Acquisition, Resource, ResourceBroker, TryAcquire};
use crate::error::BrokerError;
use crate::limits::Cost;

/// One registered resource of a [`ResourceBroker`], looked up once: its
/// calls answer exactly as the broker's on the same id, and follow a
/// re-registration of it. Cloning is cheap.
///
/// ```
/// use broker_core::{BrokerError, Cost, Limits, RateLimit, ResourceBroker};
/// # async fn demo(backend: impl broker_core::Store) -> Result<(), BrokerError> {
/// let broker = ResourceBroker::new(backend);
/// broker.register_limit("tenants", Limits::new().rate(RateLimit::per_second(100)))?;
/// let tenants = broker.resource_handle("tenants")?;
/// assert_eq!(tenants.resource(), "tenants");
/// assert!(matches!(broker.resource_handle("nope"), Err(BrokerError::UnknownResource(_))));
/// // One tenant's own state, answered at once if the store needs no I/O ...
/// match tenants.try_acquire_now("acme", Cost::default()) {
///     Some(answer) => println!("acme allowed: {}", answer?.allowed),
///     None => println!("ask with try_acquire(..).await"),
/// }
/// // ... or the resource's whole state.
/// let a = tenants.try_acquire(None, Cost::default()).await?;
/// println!("allowed: {}, retry after {:?}", a.allowed, a.wait_time);
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
    pub fn try_acquire<'s, 'a: 's>(
        &'s self,
        key: impl Into<Option<&'a str>>,
        cost: Cost,
    ) -> TryAcquire<'s> {
        let call = Some((&self.broker, self.on(), key.into(), cost));
        TryAcquire { call, later: None }
    }

    /// [`ResourceBroker::try_acquire_now`] on this resource: `None` when the
    /// store must be asked asynchronously (nothing was consumed).
    pub fn try_acquire_now<'a>(
        &self,
        key: impl Into<Option<&'a str>>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        self.broker.acquire_now(self.on(), key.into(), cost).ok()
    }
}
