//! The answers of a decision: [`Decision`] in full, [`Verdict`] in short.

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

/// A [`Decision`] in short (without [`Decision::answered_here`]).
///
/// ```
/// use broker_core::{Decision, DenyReason, Verdict};
/// let d = Decision::deny(DenyReason::Rate, 250_000);
/// assert_eq!(Verdict::from(d), Verdict::Rate(250_000));
/// assert_eq!(Decision::from(Verdict::from(d)), d);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed, holding no slot.
    Allowed,
    /// Allowed, holding a concurrency slot under this lease.
    Leased(LeaseId),
    /// Denied by a rate limit: how long until the cost would fit (µs).
    Rate(Micros),
    /// Denied: every concurrency slot is held.
    Concurrency,
}

impl Verdict {
    /// Whether the cost was taken.
    pub fn allowed(self) -> bool {
        matches!(self, Self::Allowed | Self::Leased(_))
    }
}

impl From<Decision> for Verdict {
    fn from(d: Decision) -> Self {
        match (d.allowed, d.lease, d.denied_by) {
            (true, None, _) => Self::Allowed,
            (true, Some(lease), _) => Self::Leased(lease),
            (false, _, Some(DenyReason::Concurrency)) => Self::Concurrency,
            (false, _, _) => Self::Rate(d.wait),
        }
    }
}

impl From<Verdict> for Decision {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Allowed => Decision::allow(None),
            Verdict::Leased(lease) => Decision::allow(Some(lease)),
            Verdict::Rate(wait) => Decision::deny(DenyReason::Rate, wait),
            Verdict::Concurrency => Decision::deny(DenyReason::Concurrency, 0),
        }
    }
}
