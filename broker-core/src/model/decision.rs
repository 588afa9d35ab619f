//! [`Decision`], the answer of `try`: taken, or denied and why.

use serde::{Deserialize, Serialize};

use super::time::Micros;

/// Identifies one held concurrency slot.
pub type LeaseId = u64;

/// Why an acquisition was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyReason {
    /// A rate limit has no tokens (or is under a penalty, `nb`).
    Rate,
    /// All concurrency slots are held.
    Concurrency,
}

/// The answer of `try`.
///
/// ```
/// use broker_core::{Decision, DenyReason};
/// let d = Decision::deny(DenyReason::Rate, 250_000);
/// assert_eq!((d.allowed, d.wait, d.lease), (false, 250_000, None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the cost was taken.
    pub allowed: bool,
    /// When denied by rate: how long until it would fit; else zero.
    pub wait: Micros,
    /// Why it was denied.
    pub denied_by: Option<DenyReason>,
    /// The lease taken when the resource has a concurrency limit.
    pub lease: Option<LeaseId>,
    /// Whether a store's failure policy answered in this process, so the
    /// cost is not in the store (settle it with
    /// [`Marks::ANSWERED_HERE`](super::state::Marks::ANSWERED_HERE)).
    pub answered_here: bool,
}

impl Decision {
    /// An allowed decision.
    pub fn allow(lease: Option<LeaseId>) -> Self {
        Self {
            allowed: true,
            wait: 0,
            denied_by: None,
            lease,
            answered_here: false,
        }
    }

    /// A denied decision.
    pub fn deny(reason: DenyReason, wait: Micros) -> Self {
        Self {
            allowed: false,
            wait,
            denied_by: Some(reason),
            ..Self::allow(None)
        }
    }

    /// This decision, marked [`Decision::answered_here`].
    pub fn by_failure_policy(self) -> Self {
        Self {
            answered_here: true,
            ..self
        }
    }
}
