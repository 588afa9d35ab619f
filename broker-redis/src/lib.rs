//! [`RedisBackend`]: resource states in Redis (or Redis Cluster, with the
//! `cluster` feature), shared across processes; each transition is one atomic
//! Lua script. A drop-in for the in-memory backend:
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
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builder;
mod call;
mod coalesce;
mod connection;
mod health;
mod inspect;
mod keys;
mod scripts;
mod transitions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use broker_core::BackendError;
use parking_lot::Mutex;

pub use builder::RedisBackendBuilder;

use connection::Conn;

/// `d` in whole milliseconds, saturating.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A state store in Redis. Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.set.prefix)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// The settings it was built with.
    set: RedisBackendBuilder,
    conn: Conn,
    health: health::Healths,
    maxmemory_policy: Option<String>,
    /// The coalescing queue and calls in flight of each scope with a call.
    queues: Mutex<HashMap<health::Scope, coalesce::State>>,
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
}
