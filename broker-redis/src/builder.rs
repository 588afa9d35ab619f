//! [`RedisBackendBuilder`]: the settings of a [`RedisBackend`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use broker_core::{BackendError, Clock, Failover, FailurePolicy};
use redis::RedisResult;

use crate::connection::Conn;
use crate::{health, keys, ms, Inner, RedisBackend};

/// Configures a [`RedisBackend`]. Defaults: the server's `TIME`, prefix `"rb"`,
/// 1 s connect and response timeouts, a 250 ms probe while down, 1 s TTL margin, coalescing on;
/// without a failure policy an unreachable Redis gives "unavailable" [`BackendError`]s.
///
/// ```no_run
/// use std::time::Duration;
/// use broker_core::FailurePolicy;
/// use broker_redis::RedisBackend;
/// # async fn demo(memory: impl broker_core::Store) -> Result<(), broker_core::BackendError> {
/// let store = RedisBackend::builder("redis://127.0.0.1:6379/")
///     .prefix("myapp")
///     .response_timeout(Duration::from_millis(200))
///     .connect_with_policy(FailurePolicy::local_fallback(0.25, memory))
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisBackendBuilder {
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) prefix: String,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) refund_late: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) probe_interval: Duration,
    /// The TTL margin in ms, at most 10^15 like the TTL the scripts add it to.
    pub(crate) margin_ms: u64,
    pub(crate) coalesce: bool,
    pub(crate) max_batch: usize,
    pub(crate) max_in_flight: usize,
    /// Sends even a lone decision through the batch script (for tests).
    pub(crate) batch_every_call: bool,
    pub(crate) lazy: bool,
}

impl RedisBackendBuilder {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            urls: vec![url.to_owned()],
            cluster: false,
            prefix: "rb".to_owned(),
            clock: None,
            refund_late: true,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            probe_interval: Duration::from_millis(250),
            margin_ms: 1_000,
            coalesce: true,
            max_batch: 32,
            max_in_flight: 5,
            batch_every_call: false,
            lazy: false,
        }
    }

    /// Lazy connection (default off): `connect` returns at once and the first
    /// call connects; the failure policy answers meanwhile. One server only;
    /// skips the `maxmemory-policy` check.
    ///
    /// ```no_run
    /// use broker_core::FailurePolicy;
    /// use broker_redis::RedisBackend;
    /// # async fn demo(memory: impl broker_core::Store) -> Result<(), broker_core::BackendError> {
    /// let store = RedisBackend::builder("redis://redis.internal:6379/")
    ///     .lazy_connect(true)
    ///     .connect_with_policy(FailurePolicy::local_fallback(0.25, memory))
    ///     .await?; // Ok even if Redis is not up yet.
    /// # Ok(()) }
    /// ```
    pub fn lazy_connect(mut self, lazy: bool) -> Self {
        self.lazy = lazy;
        self
    }

    /// The first part of every key (`prefix:{resource}:b`); must not hold
    /// braces. Default `"rb"`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Client-time mode: `now` comes from `clock`, for stores that reject
    /// `TIME` in scripts. Keep replicas' clock skew well under a third of the
    /// lease TTL: one ahead by `d` sees penalties and leases end up to `d` early.
    pub fn client_time(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Connects and puts the store under `policy`, which answers while Redis is
    /// unreachable. A grant after a timeout keeps its cost only under
    /// [`FailurePolicy::FailOpen`] (as in [`RedisBackendBuilder`]'s example).
    pub async fn connect_with_policy(
        mut self,
        policy: FailurePolicy,
    ) -> Result<Failover<RedisBackend>, BackendError> {
        self.refund_late = !matches!(policy, FailurePolicy::FailOpen);
        policy.check()?;
        Failover::new(self.connect().await?, policy)
    }

    /// Time allowed to open a connection, at connect and when one is opened
    /// again (a call still waits no longer than the response timeout).
    /// Default 1 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most any call waits for Redis, everything it waits for included;
    /// then the failure policy answers it. Default 1 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// While Redis is down, a background `PING` per `interval` (at least
    /// 10 ms apart, each waiting 250 ms at most) checks whether it is back;
    /// the failure policy answers every call meanwhile. Default 250 ms.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Added to every key's TTL (computed from the state); covers clock
    /// differences in client-time mode. Default 1 s.
    pub fn ttl_margin(mut self, margin: Duration) -> Self {
        self.margin_ms = ms(margin).min(1_000_000_000_000_000);
        self
    }

    /// Whether concurrent `try_acquire` calls are coalesced (default on):
    /// past [`RedisBackendBuilder::coalesce_limits`] calls in flight, the
    /// next ones go out together as one `EVALSHA`, each decided as alone.
    pub fn coalesce(mut self, enabled: bool) -> Self {
        self.coalesce = enabled;
        self
    }

    /// The limits of coalescing: at most `max_batch` decisions in one call
    /// (default 32) and `max_in_flight` calls in flight before calls queue
    /// (default 5); both at least 1, and per hash slot on a cluster.
    pub fn coalesce_limits(mut self, max_batch: usize, max_in_flight: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// Sends every `try_acquire` through the batch script (for tests).
    #[doc(hidden)]
    pub fn coalesce_every_call(mut self) -> Self {
        self.coalesce = true;
        self.batch_every_call = true;
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

    /// Connects and checks `maxmemory-policy` (a warning on any policy but
    /// `noeviction`). Fails if Redis cannot be reached now.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        keys::check_prefix(&self.prefix)?;
        let conn = Conn::open(&self).await?;
        let maxmemory_policy = match self.lazy {
            true => None,
            false => check_maxmemory_policy(&conn, &self).await,
        };
        let inner = Arc::new(Inner {
            conn,
            health: health::Healths::new(self.probe_interval),
            maxmemory_policy,
            queues: Default::default(),
            set: self,
        });
        Ok(RedisBackend { inner })
    }
}

/// Reads `maxmemory-policy` on every given node, warns unless `noeviction`
/// (an evicted bucket reads as full), and returns the first policy read.
async fn check_maxmemory_policy(conn: &Conn, b: &RedisBackendBuilder) -> Option<String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let mut found = None;
    for url in &b.urls {
        let policy: RedisResult<HashMap<String, String>> = match b.cluster {
            false => conn.query(&cmd, b.response_timeout).await,
            true => {
                async {
                    let client = redis::Client::open(url.as_str())?;
                    let mut c = client.get_multiplexed_async_connection().await?;
                    cmd.query_async(&mut c).await
                }
                .await
            }
        };
        let url = redacted(url);
        let policy = match policy {
            Ok(mut map) => map.remove("maxmemory-policy"),
            // Managed services often refuse CONFIG.
            Err(e) => {
                tracing::debug!(url, error = %e, "cannot read maxmemory-policy (CONFIG refused?)");
                continue;
            }
        };
        if let Some(policy) = policy.as_deref().filter(|p| *p != "noeviction") {
            tracing::warn!(
                url,
                policy,
                "redis maxmemory-policy may evict bucket keys mid-window (an evicted \
                 bucket reads as full; they all have a TTL, so volatile-* policies evict \
                 them too); use noeviction"
            );
        }
        found = found.or(policy);
    }
    found
}

/// The url without its password, for logs.
pub(crate) fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}
#[cfg(test)]
mod tests {
    #[test]
    fn passwords_never_reach_the_log() {
        assert_eq!(
            super::redacted("redis://user:secret@host:6379/"),
            "redis://***@host:6379/"
        );
        assert_eq!(super::redacted("redis://host/"), "redis://host/");
    }
}
