//! What the Redis fault tests share.

use std::time::Duration;

use broker_redis::{FailurePolicy, RedisBackendBuilder};

/// The bound on one call of a backend built by [`with_op_timeout`]: its
/// response timeout.
pub const OP_TIMEOUT: Duration = Duration::from_millis(400);

/// A backend builder for `url` under `policy` whose calls give up after
/// [`OP_TIMEOUT`] (a connection included, opened within 200 ms): against
/// a paused server, the calls time out in a test's virtual time.
pub fn with_op_timeout(url: &str, policy: FailurePolicy) -> RedisBackendBuilder {
    broker_redis::RedisBackend::builder(url)
        .failure_policy(policy)
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(OP_TIMEOUT)
}

/// [`with_op_timeout`], with every call while Redis is down a probe (no
/// interval between two probes): a test sees a recovery at the first call
/// after it, and virtual time running past any interval changes nothing.
pub fn every_call_a_probe(url: &str, policy: FailurePolicy) -> RedisBackendBuilder {
    with_op_timeout(url, policy).probe_interval(Duration::ZERO)
}
