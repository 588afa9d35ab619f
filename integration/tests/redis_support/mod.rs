//! What the Redis fault tests share.

use std::time::Duration;

use broker_core::FailurePolicy;
use broker_memory::MemoryBackend;
use broker_redis::RedisBackendBuilder;

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
#[allow(dead_code)]
pub fn local_fallback(share: f64) -> FailurePolicy {
    FailurePolicy::local_fallback(share, MemoryBackend::new())
}
