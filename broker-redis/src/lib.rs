//! # broker-redis
//!
//! [`RedisBackend`]: resource states in Redis, shared by every process and
//! replica that uses the same server (or Redis Cluster, with the `cluster`
//! feature), so N replicas with one credential behave as one client against
//! the upstream's quota. A drop-in for the in-memory backend:
//!
//! ```no_run
//! use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
//! use broker_redis::RedisBackend;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = ResourceBroker::new(RedisBackend::connect("redis://127.0.0.1:6379/").await?);
//! broker.register_limit("api", Limits::new().rate(RateLimit::per_second(10)))?;
//! let a = broker.try_acquire("api", Cost::default()).await?;
//! # Ok(()) }
//! ```
//!
//! - **One round trip per decision**: every transition (`try`, `book`,
//!   `take_slot`, `release`, `settle`, `penalize`, `reconcile`) is one Lua
//!   script run by `EVALSHA` (reloaded on `NOSCRIPT`): its own body over
//!   one shared helper source (`lua/lib.lua`), a line-by-line mirror of
//!   broker-core's `bucket.rs` and `state.rs` with the same names
//!   (`tokens`, `ts`, `nb`). All limits of a resource pass or none is
//!   consumed, atomically.
//! - **Coalescing** (on by default, [`RedisBackendBuilder::coalesce`]):
//!   `try_acquire` calls that start while one is in flight on the same
//!   backend go out together as one `EVALSHA` of a batch script, which
//!   applies each decision in order exactly as its own script would; each
//!   still takes one round trip and stays atomic, and a lone call is sent
//!   at once. Under load, Redis does much less work per decision.
//! - **Connections**: the `redis` crate's reconnecting connection manager
//!   (one server) or its cluster client; no client of our own.
//! - **Time**: the server's `TIME` by default, so replicas with skewed
//!   clocks agree; [`RedisBackendBuilder::client_time`] for stores that
//!   reject `TIME` in scripts. A bucket's time never runs backwards.
//! - **Keys**: `prefix:{key}:b` (buckets) and `prefix:{key}:l` (leases)
//!   share the hash tag `{key}` (on Redis Cluster, a `settle` also sets a
//!   short-lived `prefix:{key}:s:<id>` of its own, so that the cluster
//!   client's resend of it settles nothing twice: it lives 4× the
//!   response timeout and a second, at least 10 s; calls with a flow key
//!   keep a turn ledger per priority level, `prefix:{key}:t<level>v` and
//!   `:t<level>s`, see [`broker_core::store::Turns`], which lives as long
//!   as a flow stays active); keys come from `broker_core::keys`, which
//!   escapes user parts. Each key's TTL is computed from its state
//!   (including `nb`), so idle keys vanish and a penalty never expires
//!   early.
//! - **Concurrency leases** live in a sorted set by expiry: a crashed
//!   holder's slot frees itself after `lease_ttl`; a live permit's lease is
//!   renewed by the broker (`renew`, three times per `lease_ttl`), so a
//!   hold may last longer; `release` is idempotent.
//! - **Outages**: a call while Redis is unreachable fails at once with an
//!   "unavailable" [`BackendError`], which a failure policy above the store
//!   answers ([`broker_core::Failover`], or
//!   [`RedisBackendBuilder::connect_with_policy`]); logged once per outage,
//!   counted in [`Store::health`](broker_core::Store::health); recovery
//!   is automatic: while Redis is down every call fails at once, and a
//!   background `PING` per probe interval finds it back. A release that
//!   could not reach Redis is kept and sent once Redis answers again, so a
//!   freed slot does not stay taken until its lease's TTL.
//!   On a cluster, an outage is one hash slot's: the keys of a dead node's
//!   slots get the policy, the other nodes' keys are still decided by Redis
//!   (with `cluster-require-full-coverage no` on the servers; with Redis's
//!   default, `yes`, the live nodes refuse every key once a node is marked
//!   failed, and every slot a call needs goes under the policy). Each slot
//!   a call needs learns of the outage by a failed call of its own, and is
//!   counted as an outage of its own (the first slot down is logged at
//!   error level, the others while one is down at debug level); a down slot is probed
//!   by the background `PING` to its node, so the backend's health reads up
//!   again once the node is back, whether or not that slot's keys are used.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builder;
mod call;
mod coalesce;
mod connection;
mod health;
mod inspect;
mod keys;
mod pending;
mod probe;
mod scripts;
mod send;
mod startup;
mod transitions;
mod turns;

use std::sync::Arc;
use std::time::Duration;

use broker_core::{BackendError, Clock};

pub use builder::RedisBackendBuilder;

use connection::Conn;

/// A state store in Redis. Cloning is cheap and shares the connection.
#[derive(Debug, Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Conn,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    margin_ms: u64,
    /// Whether a decision Redis granted after its caller was answered
    /// without it (a timeout) gives its cost back: not under fail-open,
    /// whose call went out (see `send::Late`).
    refund_late: bool,
    /// The health of the store, or of each slot of a cluster.
    health: health::Healths,
    response_timeout: Duration,
    maxmemory_policy: Option<String>,
    /// Coalesces concurrent `try` decisions; `None` when off.
    coalescer: Option<Arc<coalesce::Coalescer>>,
    /// Releases not yet sent: handed to tasks, or kept while Redis was
    /// out of reach.
    pending: pending::Pending,
    /// The time between two probes while Redis is down.
    probe_interval: Duration,
    /// Whether the background probe runs (see `probe.rs`).
    probing: std::sync::atomic::AtomicBool,
}

/// # Connecting
impl RedisBackend {
    /// Connects with the defaults: the server's `TIME`, prefix `"rb"`, no
    /// failure policy (a call while Redis is unreachable fails).
    pub async fn connect(url: &str) -> Result<RedisBackend, BackendError> {
        Self::builder(url).connect().await
    }

    /// A builder for every other setting.
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder::new(url)
    }

    /// Connects to a Redis Cluster through the given nodes, with the
    /// defaults.
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster<I, S>(urls: I) -> Result<RedisBackend, BackendError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let urls: Vec<String> = urls.into_iter().map(Into::into).collect();
        let first = urls.first().cloned().unwrap_or_default();
        Self::builder(&first).cluster(urls).connect().await
    }

    fn from_parts(b: RedisBackendBuilder, conn: Conn, maxmemory_policy: Option<String>) -> Self {
        let response_timeout = b.timeouts.response;
        // On a cluster, a batch is split by hash tag: one call per slot.
        let coalescer = b.coalesce.enabled.then(|| {
            let settings = coalesce::Settings {
                group_by_tag: b.cluster,
                ..b.coalesce
            };
            let refund_late = b.refund_late;
            Arc::new(coalesce::Coalescer::new(
                conn.clone(),
                response_timeout,
                settings,
                refund_late,
            ))
        });
        Self {
            inner: Arc::new(Inner {
                conn,
                // At most 10^15 ms (about 31,700 years), like the TTL the
                // scripts add it to: the sum stays a plain integer for PEXPIRE.
                margin_ms: u64::try_from(b.ttl_margin.as_millis())
                    .unwrap_or(u64::MAX)
                    .min(1_000_000_000_000_000),
                prefix: b.prefix,
                clock: b.clock,
                refund_late: b.refund_late,
                health: health::Healths::new(b.probe_interval),
                response_timeout,
                maxmemory_policy,
                coalescer,
                pending: pending::Pending::default(),
                probe_interval: b.probe_interval,
                probing: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }
}
