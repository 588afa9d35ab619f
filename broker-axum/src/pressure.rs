//! [`Pressure`]: a `pressure` config registered on a broker, from which
//! the two layers are made.

use std::sync::Arc;

use broker_core::{ConfigError, OnOtherLimits, ResourceBroker};

use crate::config::PressureConfig;
use crate::policy::Policy;
use crate::response::Responses;
use crate::route::PressureLayer;
use crate::tenant::{Tenant, TenantExtractor, TenantKeys, TenantLayer};

/// A `pressure` config registered on a [`ResourceBroker`]: every route,
/// service and tenant limit becomes a limit-only resource of the broker
/// (visible in `broker.stats()`), so all instances on one shared backend
/// enforce one limit, and every layer made from it shares that state.
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
    /// Registers `config` on `broker`. The per-service limit is the only
    /// `perService` entry (none: only routes are limited); a config with
    /// several services needs [`Pressure::for_service`].
    ///
    /// A resource id of `config` that `broker` already holds with other
    /// limits (another `Pressure`'s, say two configs that both keep the
    /// default `perTenant.resource`) or as a queue (the application's own
    /// resource) is refused, naming the field, and nothing is registered:
    /// taken as it is, one config's limits would silently replace the
    /// other's. The same id with the same limits is shared, its state and
    /// counters kept (two `Pressure`s of one config enforce one limit).
    /// [`Pressure::reload`] re-configures.
    pub fn new(broker: ResourceBroker, config: &PressureConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            policy: Arc::new(Policy::new(broker, config, None, OnOtherLimits::Refuse)?),
        })
    }

    /// A reload: [`Pressure::new`] (or, with `service`,
    /// [`Pressure::for_service`]) that re-configures the limit-only
    /// resources `broker` already holds under the ids of `config` with its
    /// limits (an id of a queue is still refused). Layers made
    /// from an earlier `Pressure` on those ids follow the new limits, in
    /// their decisions and in the headers of their denials; they keep
    /// their own route table (make the app's layers anew from this one to
    /// route by the new config).
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
        Ok(Self {
            policy: Arc::new(Policy::new(
                broker,
                config,
                service,
                OnOtherLimits::Replace,
            )?),
        })
    }

    /// Registers `config` on `broker`, taking the `perService` entry named
    /// `service` as the per-service limit. An id `broker` already holds
    /// with other limits is refused, as by [`Pressure::new`].
    pub fn for_service(
        broker: ResourceBroker,
        config: &PressureConfig,
        service: &str,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            policy: Arc::new(Policy::new(
                broker,
                config,
                Some(service),
                OnOtherLimits::Refuse,
            )?),
        })
    }

    /// Sets how denials and backend failures are answered (for layers made
    /// after this call).
    pub fn with_responses(mut self, responses: Responses) -> Self {
        Arc::make_mut(&mut self.policy).responses = responses;
        self
    }

    /// Keys tenant fingerprints with `secret` (layers made after this call;
    /// a new `Pressure`, also a reload, has the built-in public key): the
    /// same on every replica of one store. See the crate docs, "Tenant ids".
    pub fn with_tenant_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        let policy = Arc::make_mut(&mut self.policy);
        let clear = policy.tenant_keys.is_clear();
        policy.tenant_keys = TenantKeys::new(Some(secret.as_ref()), clear);
        self
    }

    /// The sub-key `tenant`'s state is stored under, as the tenant stage
    /// names it in keys and logs: its fingerprint (a plain id in clear
    /// with `perTenant.clearIds`).
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
        (self.policy.tenant_keys.key(&tenant.into()).as_str()).to_owned()
    }

    /// The broker the limits live on.
    pub fn broker(&self) -> &ResourceBroker {
        &self.policy.broker
    }

    /// The route/service stage: put it outermost, before authentication.
    pub fn layer(&self) -> PressureLayer {
        PressureLayer::new(self.policy.clone())
    }

    /// The tenant stage: put it inside authentication, so `extractor` sees
    /// what auth set. Passes everything when `perTenant` is not enabled.
    pub fn tenant_layer<E: TenantExtractor>(&self, extractor: E) -> TenantLayer<E> {
        TenantLayer::new(self.policy.clone(), extractor)
    }
}
