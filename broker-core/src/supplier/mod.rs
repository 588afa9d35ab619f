//! Bucket classes of an outbound supplier, per credential: **auth** buckets wait and never fail
//! on rate, **data** buckets skip and reschedule, plus an optional egress-IP counter. A
//! [`Credential`] keeps only the fingerprint of its secret.

mod config;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use percent_encoding::{utf8_percent_encode, AsciiSet};

pub use config::{AuthBucket, Backoff, Bucket, DataBucket, Mode, RateLimitClasses, SupplierConfig};

use crate::broker::{OnOtherLimits, Permit, ResourceBroker};
use crate::error::{BrokerError, ConfigError};
use crate::keys;
use crate::limits::{Cost, Limits};
use crate::stats::bump;
use crate::telemetry;

/// A credential, known only by the fingerprint of its secret.
///
/// ```
/// use broker_core::supplier::Credential;
/// let c = Credential::from_secret("login:hunter2");
/// assert!(!format!("{c:?}").contains("hunter2"));
/// assert_eq!(c.fingerprint().len(), 16);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credential(String);

impl Credential {
    /// Fingerprints `secret` ([`keys::fingerprint`]); the secret is not kept.
    pub fn from_secret(secret: &str) -> Self {
        Self(keys::fingerprint(secret))
    }

    /// The fingerprint.
    pub fn fingerprint(&self) -> &str {
        &self.0
    }
}

/// The class of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketClass {
    /// Login and session endpoints.
    Auth,
    /// Data endpoints.
    Data,
}

impl BucketClass {
    fn as_str(self) -> &'static str {
        match self {
            BucketClass::Auth => "auth",
            BucketClass::Data => "data",
        }
    }
}

/// Where one bucket lives: resource `supplier/class/endpoint`, sub-key the
/// credential's fingerprint.
///
/// ```
/// use broker_core::supplier::{BucketClass, BucketKey, Credential};
/// let c = Credential::from_secret("token-123");
/// let k = BucketKey::new("etm", BucketClass::Auth, "login", &c);
/// assert_eq!(k.resource, "etm/auth/login");
/// assert_eq!(k.sub_key, c.fingerprint());
/// assert!(!broker_core::keys::keyed(&k.resource, &k.sub_key).contains("token-123"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// The registered resource id: `supplier/class/endpoint`.
    pub resource: String,
    /// The credential fingerprint.
    pub sub_key: String,
}

impl BucketKey {
    /// The key of `class`/`endpoint` of `supplier` for `credential`.
    pub fn new(
        supplier: &str,
        class: BucketClass,
        endpoint: &str,
        credential: &Credential,
    ) -> Self {
        Self {
            resource: resource_id(supplier, class, endpoint),
            sub_key: credential.0.clone(),
        }
    }

    /// The broker target of this bucket.
    pub fn target(&self) -> crate::Target<'_> {
        (self.resource.as_str(), self.sub_key.as_str()).into()
    }
}

fn resource_id(supplier: &str, class: BucketClass, endpoint: &str) -> String {
    /// Each name escaped as a key part, `/` too.
    const PART: &AsciiSet = &keys::SPECIAL.add(b'/');
    let part = |name| utf8_percent_encode(name, PART);
    format!("{}/{}/{}", part(supplier), class.as_str(), part(endpoint))
}

/// The answer of a data bucket.
#[derive(Debug)]
pub enum Admission {
    /// Go ahead; the permit holds a concurrency slot if there is one.
    Go(Permit),
    /// No token now: move the job, do not hold a worker.
    Skipped {
        /// When to run the job again: now plus `retry_in`.
        retry_at: SystemTime,
        /// `max(wait until the bucket opens, backoff)`.
        retry_in: Duration,
        /// The backoff for this many consecutive skips.
        backoff: Duration,
    },
}

impl Admission {
    /// Whether the request may go.
    pub fn is_go(&self) -> bool {
        matches!(self, Admission::Go(_))
    }
}

/// At most this many distinct egress IPs are counted (bounded labels).
const MAX_EGRESS_IPS: usize = 64;

/// The buckets of one supplier, registered on a broker.
///
/// ```
/// use broker_core::config::{self, Format};
/// use broker_core::supplier::{Credential, SupplierBuckets, SupplierConfig};
/// # async fn demo(broker: broker_core::ResourceBroker) -> Result<(), Box<dyn std::error::Error>> {
/// let config = config::parse::<SupplierConfig>("etm.yaml", "
/// rate_limit:
///   auth:
///     login: { rate: 1, period: 120s, mode: wait }
///   data:
///     price: { rate: 1, period: 1s, mode: skip_and_reschedule }
/// ", Format::Yaml)?;
/// let etm = SupplierBuckets::register(&broker, "etm", &config)?;
/// let who = Credential::from_secret("user:password");
/// let _login = etm.auth("login", &who).await?; // waits, never fails on rate
/// match etm.data("price", &who, 0).await? {
///     broker_core::supplier::Admission::Go(_permit) => { /* call the supplier */ }
///     broker_core::supplier::Admission::Skipped { retry_at, .. } => { /* move the job to retry_at */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SupplierBuckets {
    broker: ResourceBroker,
    supplier: String,
    config: Arc<SupplierConfig>,
    /// Requests per egress IP (informational, never limits).
    egress: Option<Arc<Mutex<BTreeMap<IpAddr, u64>>>>,
}

impl SupplierBuckets {
    /// Registers every bucket of `config` for `supplier` on `broker`, all or
    /// none, replacing other limits.
    pub fn register(
        broker: &ResourceBroker,
        supplier: &str,
        config: &SupplierConfig,
    ) -> Result<Self, ConfigError> {
        if supplier.is_empty() {
            return Err(ConfigError::invalid("supplier", "must not be empty"));
        }
        let auth = (config.rate_limit.auth.iter()).map(|(e, b)| (BucketClass::Auth, e, &b.limits));
        let data = (config.rate_limit.data.iter()).map(|(e, b)| (BucketClass::Data, e, &b.limits));
        let buckets: Vec<_> = (auth.chain(data))
            .map(|(class, e, limits)| (resource_id(supplier, class, e), limits, class, e))
            .collect();
        let entries: Vec<(&str, &Limits)> = (buckets.iter())
            .map(|(id, limits, ..)| (id.as_str(), *limits))
            .collect();
        (broker.register_limits(&entries, OnOtherLimits::Replace)).map_err(|e| {
            let (_, _, class, endpoint) = buckets[e.index];
            let field = format!("rate_limit.{}.{endpoint}", class.as_str());
            ConfigError::invalid(field, e.error.to_string())
        })?;
        Ok(Self {
            broker: broker.clone(),
            supplier: supplier.to_owned(),
            config: Arc::new(config.clone()),
            egress: config.rate_limit.egress_ip.then(Arc::default),
        })
    }

    /// Takes a token of the auth bucket `endpoint`, waiting as long as it
    /// takes.
    pub async fn auth(
        &self,
        endpoint: &str,
        credential: &Credential,
    ) -> Result<Permit, BrokerError> {
        let key = BucketKey::new(&self.supplier, BucketClass::Auth, endpoint, credential);
        if !self.config.rate_limit.auth.contains_key(endpoint) {
            return Err(BrokerError::UnknownResource(key.resource));
        }
        self.wait(&key).await
    }

    /// Asks the data bucket `endpoint`: at once in [`Mode::SkipAndReschedule`]
    /// (`skips` earlier skips set the backoff), else as [`SupplierBuckets::auth`].
    pub async fn data(
        &self,
        endpoint: &str,
        credential: &Credential,
        skips: u32,
    ) -> Result<Admission, BrokerError> {
        let key = BucketKey::new(&self.supplier, BucketClass::Data, endpoint, credential);
        let Some(bucket) = self.config.rate_limit.data.get(endpoint) else {
            return Err(BrokerError::UnknownResource(key.resource));
        };
        if bucket.mode == Mode::Wait {
            return self.wait(&key).await.map(Admission::Go);
        }
        let a = self.broker.try_acquire(key.target(), Cost::default());
        let a = a.await?;
        if a.allowed {
            return Ok(Admission::Go(a.permit));
        }
        let backoff = bucket.backoff.delay(skips);
        let retry_in = a.wait_time.max(backoff);
        if let Ok(resource) = self.broker.resource(&key.resource) {
            bump(&resource.counters.skipped);
        }
        telemetry::count(&key.resource, telemetry::SKIPPED);
        tracing::debug!(
            resource = %key.resource,
            credential = %key.sub_key,
            wait_ms = a.wait_time.as_millis() as u64,
            retry_in_ms = retry_in.as_millis() as u64,
            skips,
            "skip and reschedule"
        );
        Ok(Admission::Skipped {
            retry_at: crate::clock::system_after(retry_in),
            retry_in,
            backoff,
        })
    }

    async fn wait(&self, key: &BucketKey) -> Result<Permit, BrokerError> {
        let resource = self.broker.resource(&key.resource)?;
        let step = (resource.config.retry).ceiling(&resource.config.paced_limits());
        loop {
            let a = self
                .broker
                .acquire(key.target(), Cost::default(), step)
                .await?;
            if a.allowed {
                return Ok(a.permit);
            }
            let pause = if a.wait_time.is_zero() {
                Duration::from_millis(25)
            } else {
                a.wait_time.min(step)
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Counts one request sent from `ip`: its count, or 0 when counting is
    /// off or past 64 distinct IPs.
    pub fn note_egress(&self, ip: IpAddr) -> u64 {
        let Some(egress) = &self.egress else { return 0 };
        let mut counts = egress.lock().unwrap_or_else(|p| p.into_inner());
        let known = counts.len();
        if !counts.contains_key(&ip) {
            if known >= MAX_EGRESS_IPS {
                return 0;
            }
            if known > 0 {
                tracing::info!(supplier = %self.supplier, %ip, known, "new egress IP");
            }
        }
        let n = counts.entry(ip).or_insert(0);
        *n += 1;
        metrics::counter!(
            "resource_broker_egress_requests_total",
            "supplier" => self.supplier.clone(),
            "ip" => ip.to_string()
        )
        .increment(1);
        *n
    }

    /// Requests counted per egress IP.
    pub fn egress_counts(&self) -> BTreeMap<IpAddr, u64> {
        self.egress
            .as_ref()
            .map(|e| e.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default()
    }

    /// The broker the buckets live on (for `penalize` / `reconcile`).
    pub fn broker(&self) -> &ResourceBroker {
        &self.broker
    }
}
