//! # broker-core
//!
//! The model of resource-broker, with no I/O: limits and costs, the token
//! bucket state machine as pure functions ([`bucket`], [`state`]), clocks,
//! the retry policy, key building, stats types, the [`Backend`] trait that
//! state stores implement, and the [`ResourceBroker`] facade that offers
//! both strategies, `enqueue` (queue + execute) and `try_acquire` (check +
//! reject), over any backend.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
mod broker;
pub mod bucket;
pub mod clock;
pub mod config;
pub mod error;
pub mod headers;
pub mod keys;
pub mod limits;
mod named_fields;
pub mod observed;
pub mod pacing;
pub mod retry;
pub mod state;
pub mod stats;
pub mod striped;
pub mod supplier;
pub mod telemetry;
mod unique_keys;

pub use backend::{Backend, LocalStates};
pub use broker::{
    Acquisition, Attempt, EnqueueError, EntryError, OnOtherLimits, Permit, ResourceBroker,
    ResourceHandle, Target, TryAcquire, TryAcquireOnHandle,
};
pub use clock::{Clock, ManualClock, Micros, SystemClock, TokioClock};
pub use config::{LimitsConfig, ResourceConfig};
pub use error::{BackendError, BrokerError, ConfigError};
pub use limits::{Cost, Limits, RateLimit, Unit};
pub use observed::{Observed, ObservedLimit};
pub use retry::{Outcome, OutcomeClass, RetryPolicy};
pub use state::{
    Decision, DenyReason, LeaseId, LimitSpec, LocalVerdict, Marks, RefillTime, Reservation, Verdict,
};
pub use stats::{BackendHealth, BrokerStats, ResourceKind, ResourceStats};
