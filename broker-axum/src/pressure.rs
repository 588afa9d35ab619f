//! [`Pressure`]: a `pressure` config registered on a broker; makes the layers.

use std::sync::Arc;

use broker_core::{ConfigError, OnOtherLimits, ResourceBroker};

use crate::config::PressureConfig;
use crate::policy::Policy;
use crate::response::Responses;
use crate::route::PressureLayer;
use crate::tenant::keys::TenantKeys;
use crate::tenant::TenantLayer;
use crate::tenant::{Tenant, TenantExtractor};

/// A `pressure` config registered on a [`ResourceBroker`]: each limit is a
/// limit-only resource, shared by every layer and instance on one backend.
///
/// ```
/// use broker_axum::{FromHeader, Pressure, PressureConfig};
/// use broker_core::ResourceBroker;
/// use broker_memory::MemoryBackend;
///
/// let config = PressureConfig::from_json("inline", r#"{
///     "perService": { "rest": { "requestsPerSecond": 50 } },
///     "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 6000 } }
/// }"#).unwrap();
/// let pressure = Pressure::new(ResourceBroker::new(MemoryBackend::new()), &config).unwrap();
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "ok" }))
///     .layer(pressure.tenant_layer(FromHeader::new(http::HeaderName::from_static("x-tenant"))))
///     // .layer(your_auth_layer)
///     .layer(pressure.layer());
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct Pressure {
    policy: Arc<Policy>,
}

impl Pressure {
    /// Registers `config` on `broker` with its only `perService` entry (see
    /// [`Pressure::for_service`]). An id already held with other limits or as
    /// a queue is refused, naming the field; the same limits are shared.
    pub fn new(broker: ResourceBroker, config: &PressureConfig) -> Result<Self, ConfigError> {
        Policy::new(broker, config, None, OnOtherLimits::Refuse).map(|policy| Self { policy })
    }

    /// [`Pressure::new`] that re-configures limit-only resources already held
    /// under `config`'s ids; older layers follow the new limits but keep their route table.
    ///
    /// ```
    /// use broker_axum::{Pressure, PressureConfig};
    /// use broker_core::ResourceBroker;
    /// use broker_memory::MemoryBackend;
    ///
    /// let broker = ResourceBroker::new(MemoryBackend::new());
    /// let v1 = PressureConfig::from_json("v1", r#"{"perService": {"rest": {"requestsPerSecond": 50}}}"#)?;
    /// let v2 = PressureConfig::from_json("v2", r#"{"perService": {"rest": {"requestsPerSecond": 80}}}"#)?;
    /// let first = Pressure::new(broker.clone(), &v1)?;
    /// assert!(Pressure::new(broker.clone(), &v2).is_err(), "other limits, same id");
    /// let reloaded = Pressure::reload(broker.clone(), &v2, None)?;
    /// # let _ = (first, reloaded);
    /// # Ok::<(), broker_core::ConfigError>(())
    /// ```
    pub fn reload(
        broker: ResourceBroker,
        config: &PressureConfig,
        service: Option<&str>,
    ) -> Result<Self, ConfigError> {
        Policy::new(broker, config, service, OnOtherLimits::Replace).map(|policy| Self { policy })
    }

    /// [`Pressure::new`] with the `perService` entry named `service`.
    pub fn for_service(
        broker: ResourceBroker,
        config: &PressureConfig,
        service: &str,
    ) -> Result<Self, ConfigError> {
        Policy::new(broker, config, Some(service), OnOtherLimits::Refuse)
            .map(|policy| Self { policy })
    }

    /// Sets how denials and backend failures are answered (later layers).
    pub fn with_responses(mut self, responses: Responses) -> Self {
        Arc::make_mut(&mut self.policy).responses = responses;
        self
    }

    /// Keys tenant fingerprints with `secret` (later layers); the same on
    /// every replica of one store.
    pub fn with_tenant_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        let policy = Arc::make_mut(&mut self.policy);
        policy.tenant_keys = TenantKeys::new(Some(secret.as_ref()), policy.tenant_keys.clear);
        self
    }

    /// The sub-key (fingerprint) `tenant`'s state is stored under.
    ///
    /// ```
    /// use broker_axum::{Pressure, PressureConfig, Tenant};
    /// use broker_core::ResourceBroker;
    ///
    /// let config = PressureConfig::from_json("inline", "{}").unwrap();
    /// let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
    /// let pressure = Pressure::new(broker, &config).unwrap().with_tenant_secret("s3cret");
    /// let key = pressure.tenant_key("sk_live_4eC39HqLyjWDarjtT1zdp7dc");
    /// assert!(key.starts_with('~') && key.len() == 33 && !key.contains("sk_live"));
    /// assert_ne!(pressure.tenant_key(Tenant::Bytes(b"acme".into())), pressure.tenant_key("acme"));
    /// ```
    pub fn tenant_key<'a>(&self, tenant: impl Into<Tenant<'a>>) -> String {
        self.policy.tenant_keys.key(&tenant.into())
    }

    /// The broker the limits live on.
    pub fn broker(&self) -> &ResourceBroker {
        &self.policy.broker
    }

    /// The route/service stage: put it outermost, before authentication.
    pub fn layer(&self) -> PressureLayer {
        PressureLayer {
            policy: self.policy.clone(),
        }
    }

    /// The tenant stage: put it inside authentication, so `extractor` sees
    /// what auth set. Passes everything when `perTenant` is not enabled.
    pub fn tenant_layer<E: TenantExtractor>(&self, extractor: E) -> TenantLayer<E> {
        TenantLayer {
            policy: self.policy.clone(),
            extractor,
        }
    }
}
