//! Clocks: where "now" comes from.
//!
//! Every transition of the bucket state machine takes `now` as an argument, in
//! microseconds ([`Micros`]). A [`Clock`] supplies it: [`SystemClock`] in
//! production, [`ManualClock`] for deterministic tests driven by hand, and
//! [`TokioClock`] for tests that run under tokio's paused time (so that
//! `tokio::time::sleep` and the bucket see the same virtual time).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use crate::model::time::{micros, Micros};

/// How far ahead a wait without a representable end is taken to end (30
/// years, as tokio's own far future).
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The tokio instant `d` from now; a `d` too long to add (`Duration::MAX`
/// meaning "no limit") ends in the far future instead of panicking.
pub(crate) fn tokio_after(d: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(d).unwrap_or_else(|| now + FAR.min(d))
}

/// The system time `d` from now, as [`tokio_after`].
pub(crate) fn system_after(d: Duration) -> SystemTime {
    let now = SystemTime::now();
    now.checked_add(d).unwrap_or_else(|| now + FAR.min(d))
}

/// Source of the current time for bucket transitions.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current time in microseconds. Must never decrease.
    fn now(&self) -> Micros;
}

/// Monotonic wall-anchored clock: microseconds since the Unix epoch as read
/// once at construction, advanced by a monotonic [`Instant`] afterwards, so it
/// never runs backwards even if the system clock is stepped.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
    origin_unix: Micros,
}

impl SystemClock {
    /// A clock anchored at the current system time.
    pub fn new() -> Self {
        let origin_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(micros)
            .unwrap_or(0);
        Self {
            origin: Instant::now(),
            origin_unix,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        self.origin_unix + micros(self.origin.elapsed())
    }
}

/// Virtual time, moved only by [`ManualClock::advance`] or
/// [`ManualClock::set`]. Cloning shares the same time.
///
/// ```
/// use broker_core::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_millis(500));
/// assert_eq!(clock.now(), 500_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by`, up to the largest time there is (time
    /// never wraps around).
    pub fn advance(&self, by: Duration) {
        let by = micros(by);
        // `fetch_update` with a closure that always answers never fails.
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Sets the time to `at` microseconds if that is later than now (time
    /// never moves backwards).
    pub fn set(&self, at: Micros) {
        self.now.fetch_max(at, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

/// Time read from tokio's clock, so that tests under
/// `tokio::time::pause()` see the same virtual time in the bucket as in
/// `tokio::time::sleep`. Outside paused tests it is a monotonic clock.
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose time 0 is now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Micros {
        micros(self.origin.elapsed())
    }
}
