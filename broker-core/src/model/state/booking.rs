//! The [`Booking`] of `book` and the [`Marks`] a settlement reads.

use super::Micros;

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
/// assert_eq!((Marks::uniform(7).of(9), Marks::uniform(7).due()), (7, 7));
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

    /// The same mark for every bucket, due at `at`.
    pub fn uniform(at: Micros) -> Self {
        Self::new(at, [])
    }

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
