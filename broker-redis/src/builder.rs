//! [`RedisBackendBuilder`]: connection, time source, key prefix and
//! timeouts of a [`RedisBackend`], and the failure policy above it.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{BackendError, Clock, Failover, FailurePolicy};

use crate::connection::{Conn, Timeouts};
use crate::{coalesce, keys, startup, RedisBackend};

/// Configures a [`RedisBackend`]. Defaults: the server's `TIME`, prefix
/// `"rb"`, 1 s connect and response timeouts, a background probe per
/// 250 ms while Redis is down, 1 s TTL margin, coalescing on. Without a
/// failure policy, a call while Redis is unreachable fails with an
/// "unavailable" [`BackendError`] (fail-closed).
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
    pub(crate) timeouts: Timeouts,
    pub(crate) probe_interval: Duration,
    pub(crate) ttl_margin: Duration,
    pub(crate) coalesce: coalesce::Settings,
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
            timeouts: Timeouts {
                connect: Duration::from_secs(1),
                response: Duration::from_secs(1),
            },
            probe_interval: Duration::from_millis(250),
            ttl_margin: Duration::from_secs(1),
            coalesce: coalesce::Settings::default(),
            lazy: false,
        }
    }

    /// Lazy connection: [`RedisBackendBuilder::connect`] returns at once
    /// without talking to Redis, and the first call connects. A service
    /// can so start while Redis is down: until Redis answers, the
    /// [failure policy](RedisBackendBuilder::connect_with_policy) answers
    /// every call (without one, an "unavailable" backend error), and decisions
    /// are shared as soon as it does. The `maxmemory-policy` check needs a
    /// connection and is skipped. One server only: with
    /// a cluster (`cluster(urls)`), `connect` refuses it. Default off:
    /// `connect` fails with a clear error when Redis cannot be reached.
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

    /// Client-time mode: `now` comes from `clock` and is passed to the
    /// scripts, for stores that reject `TIME` in scripts (and for tests on
    /// a [`broker_core::ManualClock`]). Replicas' clocks should agree; a
    /// bucket never runs backwards (`now` is clamped to its `ts`, and a
    /// penalty a lagging replica puts on, a 429's or a counter's reported out,
    /// lasts as long from that `ts`), but a replica whose clock lags waits
    /// longer than needed. A replica whose clock runs ahead of the one
    /// that put a penalty on sees it end early by up to the skew: a bucket
    /// last written by the lagging replica, and the penalty of a resource
    /// without rate limits (an end time with no `ts` to read it from). A
    /// concurrency lease expires on the clock of the replica that looks
    /// at it: one whose clock runs ahead of another's by `d` takes that
    /// replica's leases for expired `d` early, so keep the skew well under
    /// the lease TTL (a third of it, the renewal interval, keeps every
    /// live lease live).
    pub fn client_time(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Connects (see [`RedisBackendBuilder::connect`]) and puts the store
    /// under `policy`, which answers while Redis is unreachable. Under
    /// [`FailurePolicy::FailOpen`], a decision Redis grants after its call
    /// timed out keeps its cost there (the call went out); under the other
    /// policies it is given back.
    ///
    /// ```no_run
    /// use broker_core::FailurePolicy;
    /// # async fn demo() -> Result<(), broker_core::BackendError> {
    /// let store = broker_redis::RedisBackend::builder("redis://127.0.0.1:6379/")
    ///     .connect_with_policy(FailurePolicy::FailOpen)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with_policy(
        mut self,
        policy: FailurePolicy,
    ) -> Result<Failover<RedisBackend>, BackendError> {
        self.refund_late = !matches!(policy, FailurePolicy::FailOpen);
        // The share is checked before connecting.
        policy.check()?;
        Failover::new(self.connect().await?, policy)
    }

    /// Time allowed to open a connection: by [`RedisBackendBuilder::connect`],
    /// and when one is opened again. A call waits for one no longer than
    /// the [response timeout](RedisBackendBuilder::response_timeout). Default 1 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// The most any call waits for Redis, a connection it waits for, the
    /// releases a decision sends ahead of itself and a batch it queues for
    /// included; then the failure policy answers it. Default 1 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.response = timeout;
        self
    }

    /// While Redis is down, a background `PING` per `interval` (at least
    /// 10 ms apart, each waiting 250 ms at most) checks whether it answers
    /// again; every call is answered by the failure policy at once
    /// meanwhile. Default 250 ms.
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

    /// Whether concurrent `try_acquire` calls on this backend are coalesced.
    /// Default on.
    ///
    /// On: while a `try_acquire` is waiting for Redis, the ones that start
    /// meanwhile queue, and go out together as one `EVALSHA` of a batch
    /// script when a call in flight returns (by default at most 5 calls in
    /// flight and 32 decisions per batch: see
    /// [`RedisBackendBuilder::coalesce_limits`]). The batch script applies each decision
    /// in order, exactly as its own script would, and answers each caller
    /// apart; every decision stays atomic and takes one round trip (a
    /// queued one waits, at most, for the call in flight when it queued). A
    /// lone call is sent at once, with no timer: the same single `EVALSHA`
    /// as with coalescing off. Under load this cuts Redis's work per
    /// decision, since one script call is shared by many decisions.
    ///
    /// Off: one `EVALSHA` per decision. Other transitions (`book`,
    /// `release`, ...) are never coalesced. On a Redis Cluster, a batch is
    /// split by resource (hash tag): the decisions on one resource go as
    /// one call, the calls for different resources at once.
    pub fn coalesce(mut self, enabled: bool) -> Self {
        self.coalesce.enabled = enabled;
        self
    }

    /// The limits of coalescing: at most `max_batch` decisions in one call
    /// (default 32) and at most `max_in_flight` calls in flight before
    /// `try_acquire` calls queue (default 5); both at least 1. More calls in
    /// flight means smaller batches but less waiting; one call in flight
    /// makes the largest batches. On a cluster both limits are per hash
    /// slot (a call's keys are all in one), so a frozen node holds up no
    /// decision on another. A process that keeps hundreds of decisions in
    /// flight on one backend may prefer larger batches, e.g. `(64, 2)`.
    pub fn coalesce_limits(mut self, max_batch: usize, max_in_flight: usize) -> Self {
        self.coalesce.max_batch = max_batch.max(1);
        self.coalesce.max_in_flight = max_in_flight.max(1);
        self
    }

    /// Sends every `try_acquire`, even a lone one, through the batch script
    /// (as a batch of one). Slower; for tests that check the batch script
    /// against the single-call one.
    #[doc(hidden)]
    pub fn coalesce_every_call(mut self) -> Self {
        self.coalesce.enabled = true;
        self.coalesce.batch_every_call = true;
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

    /// Connects, checks `maxmemory-policy` (a warning on any policy but
    /// `noeviction`) and returns the backend. Fails if Redis cannot be
    /// reached now.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        keys::check_prefix(&self.prefix)?;
        let url = self
            .urls
            .first()
            .ok_or_else(|| BackendError::new("no redis url given"))?;
        if self.lazy {
            if self.cluster {
                return Err(BackendError::new(
                    "lazy_connect applies to one server, not to a cluster",
                ));
            }
            let conn = Conn::single_lazy(url, self.timeouts)
                .map_err(|e| BackendError::new(format!("redis url {url:?}: {e}")))?;
            return Ok(RedisBackend::from_parts(self, conn, None));
        }
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
