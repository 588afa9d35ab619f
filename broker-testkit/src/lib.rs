//! Test support for resource-broker.
//!
//! - [`RedisServer`]: a real `redis-server` on a free loopback port, owned
//!   by the test (kill it, restart it); [`RedisCluster`]: a 3-node loopback
//!   cluster. Never the machine's shared Redis.
//! - [`StrictServer`]: a model of an upstream that enforces a token bucket
//!   strictly on *receive*, answering 200 or 429.
//! - [`upstream`]: the same idea as a real HTTP server on loopback, with
//!   rate-limit headers, a foreign client and an outage mode.
//! - [`Wrapped`]: a state store passing its calls on to another, with the
//!   test's [`Hooks`] where it steps in.
//! - [`capture_scoped`]: a thread's own `tracing` subscriber that no other
//!   test thread can blind.
//! - [`allowed_in_a_row`]: how many calls a resource lets through now.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod down_backend;
mod lcg;
mod log_capture;
mod redis_server;
mod strict_server;
pub mod upstream;
mod wrapped;

pub use down_backend::DownBackend;
pub use lcg::Lcg;
pub use log_capture::{capture_logs, capture_scoped, Captured};
pub use redis_server::{command_calls, free_port, raw_command, RedisCluster, RedisServer};
pub use strict_server::{StrictServer, Tally};
pub use upstream::{HeaderStyle, Quota, Upstream, UpstreamConfig};
pub use wrapped::{Hooks, Wrapped};

/// How many calls `try_acquire` lets through on `resource` now, one after
/// another until the first denial (each permit released as it is taken).
///
/// # Panics
/// When the broker fails (a test's store is expected to answer).
pub async fn allowed_in_a_row(broker: &broker_core::ResourceBroker, resource: &str) -> usize {
    let mut allowed = 0;
    while broker
        .try_acquire(resource, broker_core::Cost::default())
        .await
        .expect("the broker answers")
        .allowed
    {
        allowed += 1;
    }
    allowed
}
