//! What the Redis fault tests share.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use broker_core::FailurePolicy;
use broker_memory::MemoryBackend;
use broker_redis::RedisBackendBuilder;
use tokio::net::{TcpListener, TcpStream};

/// The bound on one call of a backend built by [`with_op_timeout`]: its
/// response timeout.
pub const OP_TIMEOUT: Duration = Duration::from_millis(400);

/// A backend builder for `url` whose calls give up after [`OP_TIMEOUT`]
/// (a connection included, opened within 200 ms): against a paused
/// server, the calls time out in a test's virtual time.
pub fn with_op_timeout(url: &str) -> RedisBackendBuilder {
    broker_redis::RedisBackend::builder(url)
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(OP_TIMEOUT)
}

/// [`with_op_timeout`], with every call while Redis is down a probe (no
/// interval between two probes): a test sees a recovery at the first call
/// after it, and virtual time running past any interval changes nothing.
pub fn every_call_a_probe(url: &str) -> RedisBackendBuilder {
    with_op_timeout(url).probe_interval(Duration::ZERO)
}

/// The local fallback at `share`, in a memory store of this process.
pub fn local_fallback(share: f64) -> FailurePolicy {
    FailurePolicy::local_fallback(share, MemoryBackend::new())
}

/// A TCP proxy on a free loopback port to Redis on `upstream`: each client
/// connection is handed, with a connection of its own to Redis, to
/// `relay`, which carries the bytes between the two. Its port.
pub async fn proxy<F, Fut>(upstream: u16, relay: F) -> u16
where
    F: Fn(TcpStream, TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                continue;
            };
            tokio::spawn(relay(client, server));
        }
    });
    port
}
