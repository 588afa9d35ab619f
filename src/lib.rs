//! # resource-broker
//!
//! *Is there capacity on this resource right now?* One broker, two
//! strategies over one state store:
//!
//! - **queue + execute**: [`ResourceBroker::enqueue`] waits for its slot,
//!   runs the work and retries it on upstream 429s;
//! - **check + reject**: [`ResourceBroker::try_acquire`] answers at once,
//!   with a wait time and a [`Permit`] that releases on drop.
//!
//! The store is a constructor argument: [`MemoryBackend`] for one process
//! (feature `memory`, on by default), `RedisBackend` for many replicas
//! (feature `redis`).
//!
//! ```
//! use resource_broker::{Cost, Limits, MemoryBackend, RateLimit, ResourceBroker};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = ResourceBroker::new(MemoryBackend::new());
//! broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(2)))?;
//! assert!(broker.try_acquire("webhooks", Cost::default()).await?.allowed);
//! assert!(broker.try_acquire("webhooks", Cost::default()).await?.allowed);
//! let third = broker.try_acquire("webhooks", Cost::default()).await?;
//! assert!(!third.allowed);
//! assert!(third.wait_time.as_millis() > 0);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// The README's snippets are compiled as a user's crate's doc tests
// (tests/user_crate.rs), where only the facade is in scope.

pub use broker_core::*;

#[cfg(feature = "memory")]
pub use broker_memory::MemoryBackend;

/// The Redis backend (feature `redis`).
#[cfg(feature = "redis")]
pub use broker_redis as redis;

/// The tower/axum layer (feature `axum`).
#[cfg(feature = "axum")]
pub use broker_axum as axum;
