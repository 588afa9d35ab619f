//! The answers of `try` ([`Decision`]) and `book` ([`Booking`]), and the
//! [`Marks`] a settlement reads.

use super::Micros;

/// Identifies one held concurrency slot.
pub type LeaseId = u64;

/// Why an acquisition was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// [`Marks::ANSWERED_HERE`]).
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

/// The answer of `book`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booking {
    /// How long after now the booked cost may be used.
    pub wait: Micros,
    /// False when the wait exceeded `max_wait` and nothing was booked.
    pub booked: bool,
    /// The booking's marks, for its settlement (`settle`'s `since`).
    pub since: Marks,
}

/// How many buckets of a booking have a mark of their own in [`Marks`].
pub const MARKED: usize = 4;

/// A booking's marks, one per bucket (the store's now, or a charged
/// bucket's later `nb`; from the fourth on, the earliest of theirs), and
/// its `due` time; a bucket penalized past its mark was penalized later.
///
/// ```
/// use broker_core::state::Marks;
/// let m = Marks::new(1_000, [1_000, 5_000]).due_at(6_000);
/// assert_eq!((m.of(0), m.of(1), m.of(2), m.due()), (1_000, 5_000, 1_000, 6_000));
/// assert_eq!((Marks::new(7, []).of(9), Marks::new(7, []).due()), (7, 7));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marks {
    marks: [Micros; MARKED],
    due: Micros,
}

impl Marks {
    /// The marks of a booking a failure policy answered outside the store.
    pub const ANSWERED_HERE: Self = Self {
        marks: [Micros::MAX; MARKED],
        due: Micros::MAX,
    };

    /// The marks of buckets `0, 1, ...` (`now` past the last), due at `now`.
    pub fn new(now: Micros, marks: impl IntoIterator<Item = Micros>) -> Self {
        let mut out = [now; MARKED];
        for (i, m) in marks.into_iter().enumerate() {
            match out.get_mut(i) {
                Some(slot) => *slot = m,
                None => out[MARKED - 1] = out[MARKED - 1].min(m),
            }
        }
        Self {
            marks: out,
            due: now,
        }
    }

    /// These marks, of a booking due at `due` on the store's clock.
    pub fn due_at(self, due: Micros) -> Self {
        Self { due, ..self }
    }

    /// Bucket `i`'s mark.
    pub fn of(&self, i: usize) -> Micros {
        self.marks[i.min(MARKED - 1)]
    }

    /// When the booking's cost is used, on the store's clock.
    pub fn due(&self) -> Micros {
        self.due
    }
}
