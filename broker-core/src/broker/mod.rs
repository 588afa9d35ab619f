//! The [`ResourceBroker`] facade: one object for both strategies.

mod calls;
mod enqueue;
mod feedback;
mod handle;
mod in_flight;
mod keeper;
mod penalties;
mod pending;
mod permit;
mod queue;
mod register;
mod resource;
mod target;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

pub use calls::TryAcquire;
pub use enqueue::{Attempt, EnqueueError};
pub use handle::ResourceHandle;
use permit::HeldKey;
pub use permit::{Acquisition, Permit};
pub use register::{EntryError, OnOtherLimits};
pub(crate) use resource::{note_backend_error, Resource};
pub(crate) use resource::{Epochs, Latest};
pub use target::{Priority, Target};

use crate::config::ResourceConfig;
use crate::error::{BrokerError, ConfigError};
use crate::keys;
use crate::limits::Limits;
use crate::stats::{BrokerStats, ResourceKind};
use crate::store::Store;

/// One broker over one state store: `enqueue` (queue + execute) and
/// `try_acquire` / `acquire` (check + reject) on the same resources.
///
/// Cloning is cheap and shares everything.
///
/// ```
/// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
/// # async fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
/// let broker = ResourceBroker::new(backend);
/// broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(100)))?;
/// let a = broker.try_acquire("webhooks", Cost::default()).await?;
/// if !a.allowed {
///     println!("429, retry after {:?}", a.wait_time);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ResourceBroker {
    inner: Arc<Inner>,
}

/// Registered resources by id.
type Registry = HashMap<String, Arc<Resource>, foldhash::fast::RandomState>;

struct Inner {
    backend: Arc<dyn Store>,
    resources: ArcSwap<Registry>,
    register: parking_lot::Mutex<()>,
    keeper: Option<Arc<keeper::Keeper>>,
}

impl std::fmt::Debug for ResourceBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceBroker")
            .field("resources", &self.inner.resources.load().len())
            .finish()
    }
}

/// # Construction and registration
impl ResourceBroker {
    /// A broker over `backend`.
    pub fn new(backend: impl Store) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A broker over a shared backend.
    pub fn from_arc(backend: Arc<dyn Store>) -> Self {
        let keeper = backend
            .local()
            .is_none()
            .then(|| Arc::new(keeper::Keeper::new(backend.clone())));
        Self {
            inner: Arc::new(Inner {
                keeper,
                backend,
                resources: ArcSwap::from_pointee(Registry::default()),
                register: parking_lot::Mutex::new(()),
            }),
        }
    }

    /// Registers (or re-configures) a resource.
    pub fn register(&self, resource: &str, config: ResourceConfig) -> Result<(), ConfigError> {
        let ready = self.ready(resource, config, ResourceKind::Queue)?;
        self.commit(vec![ready], |_, _, _| Ok(true))
            .map_err(|e| e.error)
    }

    /// Registers (or re-configures) a limit-only resource, for
    /// `try_acquire` and `acquire`; `enqueue` on it queues with the
    /// defaults of [`ResourceConfig::new`].
    pub fn register_limit(&self, resource: &str, limits: Limits) -> Result<(), ConfigError> {
        let config = ResourceConfig::new(limits);
        let ready = self.ready(resource, config, ResourceKind::LimitOnly)?;
        self.commit(vec![ready], |_, _, _| Ok(true))
            .map_err(|e| e.error)
    }

    pub(crate) fn resource(&self, id: &str) -> Result<Arc<Resource>, BrokerError> {
        self.inner
            .resources
            .load()
            .get(id)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownResource(id.to_owned()))
    }

    /// The registration `target` names, and its state key.
    pub(super) fn state_of(
        &self,
        target: Target<'_>,
    ) -> Result<(Arc<Resource>, String), BrokerError> {
        let resource = self.resource(target.resource)?;
        let key =
            (target.key).map_or_else(|| resource.key.clone(), |k| keys::keyed(&resource.id, k));
        Ok((resource, key))
    }

    /// The limits a resource was registered with.
    pub fn limits(&self, resource: &str) -> Result<Limits, BrokerError> {
        Ok(self.resource(resource)?.config.limits.clone())
    }

    /// Counters of every resource since its latest registration (`queued`
    /// and `in_flight` also count earlier ones), and the store's health.
    pub fn stats(&self) -> BrokerStats {
        let resources = self.inner.resources.load();
        let stats = |r: &Arc<Resource>| r.counters.snapshot(r.kind, &r.live, r.lines.stats());
        BrokerStats {
            resources: (resources.values())
                .map(|r| (r.id.clone(), stats(r)))
                .collect(),
            backend: self.inner.backend.health(),
        }
    }
}
