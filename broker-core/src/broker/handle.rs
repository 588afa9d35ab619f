//! [`ResourceHandle`]: one registered resource, looked up once, for callers
//! that check the same resource on every request.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{
    acquisition, Acquisition, Call, FirstPoll, Later, Permit, Resource, ResourceBroker, Target,
    TryAcquireOnHandle,
};
use crate::error::BrokerError;
use crate::limits::Cost;
use crate::state::Verdict;

/// One registered resource of a [`ResourceBroker`], resolved once:
/// [`ResourceHandle::try_acquire`] and [`ResourceHandle::try_acquire_now`]
/// answer exactly as the broker's calls on the same resource, without
/// looking the resource up by id on each call. Cloning is cheap.
///
/// A handle follows re-registration: once the resource is registered again
/// (new limits, new counters), the handle's calls go through the broker's
/// registry and so reach the new registration, as
/// [`ResourceBroker::try_acquire`] would.
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
    /// A handle on the registered `resource`, for repeated `try_acquire`
    /// calls without a lookup by id (see [`ResourceHandle`]). Unknown
    /// resource: [`BrokerError::UnknownResource`].
    ///
    /// ```
    /// use broker_core::{BrokerError, Limits, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(10)))?;
    /// let webhooks = broker.resource_handle("webhooks")?;
    /// assert_eq!(webhooks.resource(), "webhooks");
    /// assert!(matches!(
    ///     broker.resource_handle("nope"),
    ///     Err(BrokerError::UnknownResource(_))
    /// ));
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
    /// resource's: false once the id has been registered again (calls on
    /// the handle then follow the newer registration, its limits too).
    pub fn is_current(&self) -> bool {
        !self.resource.retired.load(Ordering::Acquire)
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
    ) -> TryAcquireOnHandle<'s> {
        TryAcquireOnHandle(FirstPoll::new(OnHandle {
            handle: self,
            key: key.into(),
            cost,
        }))
    }

    /// [`ResourceBroker::quick`] on this resource, unless a registration
    /// replaced it.
    fn quick(&self, key: Option<&str>, cost: Cost, permit: &mut Permit) -> Option<Verdict> {
        if self.resource.retired.load(Ordering::Acquire) {
            return None;
        }
        self.broker.quick(&self.resource, key, cost, permit)
    }

    /// The common case of [`ResourceHandle::try_acquire_now`], in its
    /// compact form for a caller on a hot path (a tower service deciding
    /// in `call`): when the store answers in process and the cost fits,
    /// the [`Verdict`], counted in the stats, with the slot of a
    /// [`Verdict::Leased`] put in `permit`. Else `None`, with nothing
    /// consumed or counted: `try_acquire_now` (or `try_acquire`) then
    /// makes the call in full, and gives the error if there is one.
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
        self.quick(key, cost, permit)
    }

    /// [`ResourceBroker::try_acquire_now`] on this resource: `Some(answer)`
    /// when the backend answered without I/O, `None` when it must be asked
    /// asynchronously (nothing was consumed; call
    /// [`ResourceHandle::try_acquire`]).
    ///
    /// ```
    /// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("tenants", Limits::new().rate(RateLimit::per_second(100)))?;
    /// let tenants = broker.resource_handle("tenants")?;
    /// match tenants.try_acquire_now("acme", Cost::default()) {
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
        let key = key.into();
        let mut permit = Permit::empty();
        if let Some(v) = self.quick(key, cost, &mut permit) {
            return Some(Ok(acquisition(v, permit)));
        }
        self.try_acquire_now_in_full(key, cost)
    }

    /// [`ResourceHandle::try_acquire_now`] past its common case, out of
    /// the callers' line.
    fn try_acquire_now_in_full(
        &self,
        key: Option<&str>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        if self.resource.retired.load(Ordering::Acquire) {
            let target = Target::keyed(&self.resource.id, key);
            return self.broker.try_acquire_now(target, cost);
        }
        self.broker
            .acquire_now(&self.resource, key, cost, &mut None)
    }
}

/// `try_acquire` on a handle, as its future holds it.
pub(super) struct OnHandle<'s> {
    handle: &'s ResourceHandle,
    key: Option<&'s str>,
    cost: Cost,
}

impl<'s> Call<'s> for OnHandle<'s> {
    fn quick(&self, permit: &mut Permit) -> Option<Verdict> {
        self.handle.quick(self.key, self.cost, permit)
    }

    fn start(self) -> Result<Result<Acquisition, BrokerError>, Later<'s>> {
        let (handle, key, cost) = (self.handle, self.key, self.cost);
        let broker = &handle.broker;
        if handle.resource.retired.load(Ordering::Acquire) {
            let target = Target::keyed(&handle.resource.id, key);
            return Err(Box::pin(broker.try_acquire(target, cost)) as Later<'s>);
        }
        let mut state_key = None;
        broker
            .acquire_now(&handle.resource, key, cost, &mut state_key)
            .ok_or_else(|| {
                Box::pin(broker.try_acquire_later(handle.resource.clone(), state_key, cost))
                    as Later<'s>
            })
    }
}
