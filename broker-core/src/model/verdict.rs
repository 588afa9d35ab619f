//! The answers of a decision: [`Decision`] in full, [`Verdict`] in short,
//! [`LocalVerdict`] with a wait maybe not rounded yet.

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
            lease: None,
            answered_here: false,
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

/// A [`Verdict`] from [`LocalStates::try_acquire`](crate::LocalStates::try_acquire),
/// whose rate wait may still be unrounded ([`LocalVerdict::Short`]).
///
/// ```
/// use broker_core::{LocalVerdict, RefillTime, Verdict};
/// assert_eq!(LocalVerdict::Short(RefillTime::new(2.5)).verdict(), Verdict::Rate(3));
/// assert_eq!(LocalVerdict::Short(RefillTime::new(4.0004)).verdict(), Verdict::Rate(4));
/// assert!(!LocalVerdict::Short(RefillTime::new(2.5)).allowed());
/// assert_eq!(LocalVerdict::from(Verdict::Rate(7)).verdict(), Verdict::Rate(7));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalVerdict {
    /// Allowed, holding no slot.
    Allowed,
    /// Allowed, holding a concurrency slot under this lease.
    Leased(LeaseId),
    /// Denied by a rate limit: how long until the cost would fit, in µs.
    Rate(Micros),
    /// Denied by a rate limit with no penalty in force: the unrounded refill
    /// time.
    Short(RefillTime),
    /// Denied: every concurrency slot is held.
    Concurrency,
}

impl LocalVerdict {
    /// The verdict, a denial's wait rounded up to whole µs.
    pub fn verdict(self) -> Verdict {
        match self {
            Self::Allowed => Verdict::Allowed,
            Self::Leased(lease) => Verdict::Leased(lease),
            Self::Rate(wait) => Verdict::Rate(wait),
            Self::Short(refill) => Verdict::Rate(refill.micros()),
            Self::Concurrency => Verdict::Concurrency,
        }
    }

    /// Whether the cost was taken.
    pub fn allowed(self) -> bool {
        matches!(self, Self::Allowed | Self::Leased(_))
    }
}

/// An unrounded refill time in µs (an `f64`'s bits, so that it is `Eq`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RefillTime(u64);

impl RefillTime {
    /// The refill time of `micros` µs (positive, unrounded).
    pub fn new(micros: f64) -> Self {
        Self(micros.to_bits())
    }

    /// The refill time in µs, unrounded.
    pub fn as_f64(self) -> f64 {
        f64::from_bits(self.0)
    }

    /// The wait in whole µs ([`super::time::ceil_micros`]).
    pub fn micros(self) -> Micros {
        super::time::ceil_micros(self.as_f64())
    }
}

impl std::fmt::Debug for RefillTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RefillTime({} µs)", self.as_f64())
    }
}

impl From<Verdict> for LocalVerdict {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Allowed => Self::Allowed,
            Verdict::Leased(lease) => Self::Leased(lease),
            Verdict::Rate(wait) => Self::Rate(wait),
            Verdict::Concurrency => Self::Concurrency,
        }
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
