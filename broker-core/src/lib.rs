//! The pure model of resource-broker (limits, the token bucket, state, headers, retries, keys),
//! the [`Store`] seam, and the [`ResourceBroker`] with `enqueue` (queue + execute) and
//! `try_acquire` (check + reject).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod broker;
pub mod clock;
pub mod config;
mod model;
pub mod stats;
pub mod store;
pub mod supplier;
pub mod telemetry;

pub use model::{bucket, error, headers, keys, limits, observed, retry, state};

pub use broker::{
    Acquisition, Attempt, EnqueueError, EntryError, OnOtherLimits, Permit, Priority,
    ResourceBroker, ResourceHandle, Target, TryAcquire,
};
pub use clock::{Clock, ManualClock, Micros, SystemClock, TokioClock};
pub use config::ResourceConfig;
pub use error::{BackendError, BrokerError, ConfigError, WaitBound};
pub use limits::{Cost, Limits, RateLimit, Unit};
pub use observed::{Observed, ObservedLimit};
pub use retry::{Outcome, OutcomeClass, RetryPolicy};
pub use state::{Booking, Decision, DenyReason, LeaseId, LimitSpec, Marks};
pub use stats::{BackendHealth, BrokerStats, ResourceKind, ResourceStats};
pub use store::{Failover, FailurePolicy, LocalStates, LocalStore, Renewal, Store};
