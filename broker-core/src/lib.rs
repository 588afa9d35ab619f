//! # broker-core
//!
//! The model of resource-broker and the runtime above it. The model
//! (`src/model/`, no I/O): limits and costs, the token bucket state machine
//! as pure functions ([`bucket`], [`state`]), header parsing, the retry
//! policy, key building. Above it: clocks, stats, the [`Store`] trait that
//! state stores implement, and the [`ResourceBroker`] facade that offers
//! both strategies, `enqueue` (queue + execute) and `try_acquire` (check +
//! reject), over any backend. At the edge: config loading ([`config`]) and
//! the [`supplier`] classes.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod broker;
pub mod clock;
pub mod config;
mod integrations;
mod model;
pub mod stats;
pub mod store;
pub mod telemetry;

pub use integrations::supplier;
pub use model::{bucket, error, headers, keys, limits, observed, pacing, retry, state};

pub use broker::{
    Acquisition, Attempt, EnqueueError, EntryError, OnOtherLimits, Permit, Priority,
    ResourceBroker, ResourceHandle, Target, TryAcquire, TryAcquireOnHandle,
};
pub use clock::{Clock, ManualClock, Micros, SystemClock, TokioClock};
pub use config::{LimitsConfig, ResourceConfig};
pub use error::{BackendError, BrokerError, ConfigError, WaitBound};
pub use limits::{Cost, Limits, RateLimit, Unit};
pub use observed::{Observed, ObservedLimit};
pub use retry::{Outcome, OutcomeClass, RetryPolicy};
pub use state::{
    Booking, Decision, DenyReason, LeaseId, LimitSpec, LocalVerdict, Marks, RefillTime, Verdict,
};
pub use stats::{BackendHealth, BrokerStats, ResourceKind, ResourceStats};
pub use store::{Failover, FailurePolicy, LocalStates, LocalStore, Releases, Renewal, Store};
