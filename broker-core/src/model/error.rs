//! Configuration, backend and broker errors.

use std::time::Duration;

/// A configuration that cannot be used. The message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A value outside its allowed range or of the wrong shape.
    #[error("{field}: {reason}")]
    Invalid {
        /// Path of the field, e.g. `rates[0].amount`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The resource id is registered already in a way a batch registration
    /// may not change.
    #[error("resource {id:?} is already registered {reason}")]
    Taken {
        /// The resource id.
        id: String,
        /// How it is registered, e.g. `with other limits`.
        reason: String,
    },
    /// The resource id is empty or too long.
    #[error("resource id {0:?} is invalid: it must be 1..=256 bytes")]
    BadResourceId(String),
    /// The file or document could not be parsed.
    #[error("{source_name}: {message}")]
    Parse {
        /// File name (or `"<inline>"`).
        source_name: String,
        /// The parser's message, which names the path inside the document.
        message: String,
    },
}

impl ConfigError {
    /// A numeric field that must be positive was zero (`value` as written).
    pub fn not_positive(field: impl Into<String>, value: impl std::fmt::Display) -> Self {
        Self::invalid(field, format!("must be greater than zero (got {value})"))
    }

    /// Shorthand for [`ConfigError::Invalid`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A state store failed (Redis unreachable, script error, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backend error: {message}")]
pub struct BackendError {
    /// What went wrong, as reported by the store.
    pub message: String,
    /// The store could not be reached (see [`BackendError::is_unavailable`]).
    unavailable: bool,
}

impl BackendError {
    /// A backend error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            unavailable: false,
        }
    }

    /// The store could not be reached (a [`Failover`](crate::store::Failover)
    /// answers these by its policy).
    ///
    /// ```
    /// use broker_core::BackendError;
    /// assert!(BackendError::unavailable("no reply within 1s").is_unavailable());
    /// assert!(!BackendError::new("WRONGTYPE").is_unavailable());
    /// ```
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            unavailable: true,
        }
    }

    /// Whether the store could not be reached.
    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }
}

/// Errors from the [`crate::ResourceBroker`] facade.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BrokerError {
    /// No resource was registered under this id.
    #[error("unknown resource {0:?}: register it first")]
    UnknownResource(String),
    /// The cost is larger than a limit's burst: it can never fit.
    #[error(
        "cost {cost} {unit} on resource {resource:?} can never fit: the limit's burst is {burst}"
    )]
    CostNeverFits {
        /// Resource id.
        resource: String,
        /// The cost asked for, in `unit`.
        cost: u64,
        /// `requests` or `tokens`.
        unit: &'static str,
        /// The burst of the limit it exceeds.
        burst: u64,
    },
    /// The resource's queue is full: refused at once.
    #[error("queue of resource {resource:?} is full ({depth} waiting, capacity {capacity})")]
    QueueFull {
        /// Resource id.
        resource: String,
        /// The calls waiting when this one was refused.
        depth: usize,
        /// The configured queue capacity.
        capacity: usize,
    },
    /// The call would wait beyond its deadline or, for a penalty, the retry
    /// policy's ceiling.
    #[error(
        "resource {resource:?}: waited {waited:?}; the next send time is {would_wait:?} away, beyond {bound}"
    )]
    WaitTooLong {
        /// Resource id.
        resource: String,
        /// How long the call has waited (since it was enqueued).
        waited: Duration,
        /// How long it would still wait (an estimate while still queued).
        would_wait: Duration,
        /// The bound it met.
        bound: WaitBound,
    },
    /// The backend failed and the failure policy did not cover it.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A configuration error.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The bound a wait met (see [`BrokerError::WaitTooLong`]).
///
/// ```
/// use broker_core::WaitBound;
/// use std::time::Duration;
/// let bound = WaitBound::PenaltyCeiling(Duration::from_secs(3));
/// assert_eq!(bound.to_string(), "the penalty ceiling 3s");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitBound {
    /// The call's deadline, counted from when the call began.
    #[error("the deadline {0:?}")]
    Deadline(Duration),
    /// The retry policy's ceiling, which bounds a penalty and a retry pause.
    #[error("the penalty ceiling {0:?}")]
    PenaltyCeiling(Duration),
}
