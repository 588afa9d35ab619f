//! One broker, two strategies over one state store: [`ResourceBroker::enqueue`] waits, runs the
//! work and retries it on upstream 429s; [`ResourceBroker::try_acquire`] answers at once. Stores:
//! [`MemoryBackend`] (feature `memory`, default), `RedisBackend` for replicas (feature `redis`).
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
#![forbid(unsafe_code)]
#![warn(missing_docs)]
pub use broker_core::{
    Acquisition, BackendError, BrokerError, BrokerStats, Clock, ConfigError, Cost, EnqueueError,
    FailurePolicy, Limits, ManualClock, Outcome, OutcomeClass, Permit, Priority, RateLimit,
    ResourceBroker, ResourceConfig, ResourceHandle, ResourceStats, RetryPolicy, SystemClock,
    Target, TokioClock, Unit, WaitBound,
};

/// The argument and future types of the broker's calls.
pub mod calls {
    pub use broker_core::{Attempt, EntryError, OnOtherLimits, TryAcquire};
}

/// Reading an upstream's rate-limit headers (`headers::parse`).
pub mod headers {
    pub use broker_core::headers::*;
    pub use broker_core::{Observed, ObservedLimit};
    pub use http::{HeaderMap, HeaderValue};
}

/// Config documents: limits, resources, supplier bucket classes.
pub mod config {
    pub use broker_core::config::*;
    pub use broker_core::supplier;
}

/// Counters and health that `ResourceBroker::stats` reports.
pub mod stats {
    pub use broker_core::stats::*;
}

/// For writers of a state store: the [`Store`](store::Store) seam, its
/// capabilities, [`Failover`](store::Failover), and the model a store runs.
pub mod store {
    pub use broker_core::store::{
        Failover, LocalStates, LocalStore, Renewal, Store, Turn, TurnAsk, Turns,
    };
    pub use broker_core::{bucket, keys, state};
    pub use broker_core::{
        BackendHealth, Booking, Decision, DenyReason, LeaseId, LimitSpec, Marks, Micros,
        ObservedLimit,
    };
}

#[cfg(feature = "memory")]
pub use broker_memory::MemoryBackend;

/// The Redis backend (feature `redis`).
#[cfg(feature = "redis")]
pub use broker_redis as redis;

/// The tower/axum layer (feature `axum`).
#[cfg(feature = "axum")]
pub use broker_axum as axum;
