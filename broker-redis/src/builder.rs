//! [`RedisBackendBuilder`]: connection, time source, key prefix, failure
//! policy and timeouts of a [`RedisBackend`].

use std::sync::Arc;
use std::time::Duration;

use broker_core::{BackendError, Clock};

use crate::connection::{Conn, Timeouts};
use crate::failure::FailurePolicy;
use crate::{keys, startup, RedisBackend};

/// Configures a [`RedisBackend`]. Defaults: the server's `TIME`, prefix
/// `"rb"`, [`FailurePolicy::FailClosed`], 1 s connect and response timeouts,
/// one probe per 250 ms while Redis is down, 1 s TTL margin.
///
/// ```no_run
/// use std::time::Duration;
/// use broker_redis::{FailurePolicy, RedisBackend};
/// # async fn demo() -> Result<(), broker_core::BackendError> {
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379/")
///     .prefix("myapp")
///     .failure_policy(FailurePolicy::LocalFallback { share: 0.25 })
///     .response_timeout(Duration::from_millis(200))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisBackendBuilder {
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) prefix: String,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) policy: FailurePolicy,
    pub(crate) timeouts: Timeouts,
    pub(crate) probe_interval: Duration,
    pub(crate) ttl_margin: Duration,
}

impl RedisBackendBuilder {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            urls: vec![url.to_owned()],
            cluster: false,
            prefix: "rb".to_owned(),
            clock: None,
            policy: FailurePolicy::default(),
            timeouts: Timeouts {
                connect: Duration::from_secs(1),
                response: Duration::from_secs(1),
            },
            probe_interval: Duration::from_millis(250),
            ttl_margin: Duration::from_secs(1),
        }
    }

    /// The first part of every key (`prefix:{resource}:b`); must not hold
    /// braces. Default `"rb"`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Client-time mode: `now` comes from `clock` and is passed to the
    /// scripts, for stores that reject `TIME` in scripts (and for tests on
    /// a [`broker_core::ManualClock`]). Replicas' clocks should agree; a
    /// bucket never runs backwards (`now` is clamped to its `ts`), but a
    /// replica whose clock lags waits longer than needed.
    pub fn client_time(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// What to answer while Redis is unreachable. Default
    /// [`FailurePolicy::FailClosed`].
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Time allowed to open a connection. Default 1 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// Time allowed for one reply. Default 1 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.response = timeout;
        self
    }

    /// While Redis is down, one call per `interval` tries it; the others
    /// are answered by the failure policy at once. Default 250 ms.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Added to every key's TTL (computed from the state: until the
    /// buckets are full and `nb` has passed). Keeping an idle key longer is
    /// harmless; the margin covers clock differences in client-time mode.
    /// Default 1 s.
    pub fn ttl_margin(mut self, margin: Duration) -> Self {
        self.ttl_margin = margin;
        self
    }

    /// Connects to a Redis Cluster through the given nodes instead of one
    /// server.
    #[cfg(feature = "cluster")]
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.urls = urls.into_iter().map(Into::into).collect();
        self.cluster = true;
        self
    }

    /// Connects, checks `maxmemory-policy` (a warning on `allkeys-*`) and
    /// returns the backend. Fails if Redis cannot be reached now.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        keys::check_prefix(&self.prefix)?;
        self.policy.validate()?;
        let url = self
            .urls
            .first()
            .ok_or_else(|| BackendError::new("no redis url given"))?;
        let conn = if self.cluster {
            self.connect_cluster().await?
        } else {
            Conn::single(url, self.timeouts)
                .await
                .map_err(|e| BackendError::new(format!("connecting to redis: {e}")))?
        };
        let maxmemory_policy = startup::check_maxmemory_policy(&conn, &self).await;
        Ok(RedisBackend::from_parts(self, conn, maxmemory_policy))
    }

    #[cfg(feature = "cluster")]
    async fn connect_cluster(&self) -> Result<Conn, BackendError> {
        Conn::cluster(&self.urls, self.timeouts)
            .await
            .map_err(|e| BackendError::new(format!("connecting to redis cluster: {e}")))
    }

    #[cfg(not(feature = "cluster"))]
    async fn connect_cluster(&self) -> Result<Conn, BackendError> {
        Err(BackendError::new(
            "redis cluster support needs the `cluster` feature",
        ))
    }
}
