//! What a case runs on: a backend, the virtual clock it reads, and the
//! processes it needs (a redis-server) kept alive for the case.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use broker_core::{ManualClock, Store};
use broker_memory::MemoryBackend;
use broker_redis::{RedisBackend, RedisBackendBuilder};
use broker_testkit::RedisServer;

/// A backend on a virtual clock, and its keys' namespace.
pub struct Env {
    /// The store under test.
    pub backend: Arc<dyn Store>,
    /// The clock the store reads (client time for Redis).
    pub clock: ManualClock,
    namespace: String,
    _keep: Option<Box<dyn Any + Send + Sync>>,
}

impl Env {
    /// A state key unique to this case.
    pub fn key(&self, name: &str) -> String {
        broker_core::keys::keyed(&self.namespace, name)
    }

    /// Moves virtual time forward.
    pub fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }
}

/// The in-memory store.
pub async fn memory(namespace: &str) -> Env {
    let clock = ManualClock::new();
    Env {
        backend: Arc::new(MemoryBackend::with_clock(clock.clone())),
        clock,
        namespace: namespace.to_owned(),
        _keep: None,
    }
}

/// A Redis backend in client-time mode on `url`.
pub async fn redis_on(url: &str, namespace: &str) -> Env {
    redis_with(url, namespace, |b| b).await
}

/// A Redis backend in client-time mode on `url`, configured further by
/// `configure`.
pub async fn redis_with(
    url: &str,
    namespace: &str,
    configure: impl FnOnce(RedisBackendBuilder) -> RedisBackendBuilder,
) -> Env {
    let clock = ManualClock::new();
    let backend = configure(RedisBackend::builder(url))
        .client_time(Arc::new(clock.clone()))
        .ttl_margin(Duration::from_secs(60))
        .connect()
        .await
        .expect("connect to the test's redis-server");
    Env {
        backend: Arc::new(backend),
        clock,
        namespace: namespace.to_owned(),
        _keep: None,
    }
}

/// A Redis backend on its own fresh redis-server.
pub async fn redis(namespace: &str) -> Env {
    let server = RedisServer::start();
    let mut env = redis_on(&server.url(), namespace).await;
    env._keep = Some(Box::new(server));
    env
}

/// A Redis backend on its own fresh redis-server that sends every `try`,
/// even a lone one, through the coalescing batch script.
pub async fn redis_batched(namespace: &str) -> Env {
    let server = RedisServer::start();
    let mut env = redis_with(&server.url(), namespace, |b| b.coalesce_every_call()).await;
    env._keep = Some(Box::new(server));
    env
}

/// A Redis Cluster backend in client-time mode through `urls`.
pub async fn cluster_on(urls: &[String], namespace: &str) -> Env {
    cluster_with(urls, namespace, |b| b).await
}

/// A Redis Cluster backend in client-time mode through `urls`, configured
/// further by `configure`.
pub async fn cluster_with(
    urls: &[String],
    namespace: &str,
    configure: impl FnOnce(RedisBackendBuilder) -> RedisBackendBuilder,
) -> Env {
    let clock = ManualClock::new();
    let backend = configure(RedisBackend::builder(&urls[0]))
        .cluster(urls.iter().cloned())
        .client_time(Arc::new(clock.clone()))
        .ttl_margin(Duration::from_secs(60))
        .connect()
        .await
        .expect("connect to the test's redis cluster");
    Env {
        backend: Arc::new(backend),
        clock,
        namespace: namespace.to_owned(),
        _keep: None,
    }
}
