//! Clocks: [`SystemClock`] in production, [`ManualClock`] driven by hand,
//! [`TokioClock`] under tokio's paused time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use crate::model::time::{micros, Micros};

/// Where a wait with no representable end ends (30 years, as in tokio).
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The tokio instant `d` from now; a `d` too long to add ends at [`FAR`].
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

/// µs since the Unix epoch, advanced by a monotonic [`Instant`].
///
/// ```
/// use broker_core::{Clock, SystemClock};
/// let c = SystemClock::new();
/// assert!(c.now() <= c.now());
/// ```
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
    origin_unix: Micros,
}

impl SystemClock {
    /// A clock anchored at the current system time.
    pub fn new() -> Self {
        let origin_unix = UNIX_EPOCH.elapsed().map_or(0, micros);
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

    /// Moves time forward by `by`, saturating.
    pub fn advance(&self, by: Duration) {
        let by = micros(by);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Sets the time to `at` µs if later than now.
    pub fn set(&self, at: Micros) {
        self.now.fetch_max(at, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

/// Time from tokio's clock (virtual under `tokio::time::pause()`).
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
