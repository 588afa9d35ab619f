//! [`QuantaClock`], the default clock of [`crate::MemoryBackend`].

use broker_core::{Clock, Micros, SystemClock};
use std::sync::OnceLock;

/// A monotonic [`quanta::Clock`] counting microseconds since the Unix epoch
/// as read at construction.
#[derive(Debug, Clone)]
pub(crate) struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
    origin_unix: Micros,
}

impl QuantaClock {
    pub(crate) fn new() -> Self {
        // One calibrated clock per process (calibration takes milliseconds).
        static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
        let clock = CLOCK.get_or_init(quanta::Clock::new).clone();
        Self {
            origin: clock.raw(),
            clock,
            origin_unix: SystemClock::new().now(),
        }
    }
}

impl Clock for QuantaClock {
    fn now(&self) -> Micros {
        let nanos = self.clock.delta_as_nanos(self.origin, self.clock.raw());
        self.origin_unix + nanos / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_same_time_as_the_system_clock() {
        let system = broker_core::SystemClock::new();
        let quanta = QuantaClock::new();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (s, q) = (system.now(), quanta.now());
        // Both anchored at the Unix time read at construction (a few µs
        // apart) and advanced by a monotonic source since: the same time base
        // and unit, up to a preemption between the two reads.
        assert!(s.abs_diff(q) < 100_000, "system {s} vs quanta {q}");
        assert!(q >= quanta.origin_unix + 20_000);
    }

    #[test]
    fn advances_as_the_system_clock_does() {
        // A counter read at another scale than the one calibrated would
        // run 2-3 times too fast or too slow over the 100 ms.
        let system = broker_core::SystemClock::new();
        let quanta = QuantaClock::new();
        let (s0, q0) = (system.now(), quanta.now());
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (s1, q1) = (system.now(), quanta.now());
        let (ds, dq) = (s1 - s0, q1 - q0);
        assert!(ds.abs_diff(dq) < 10_000, "system +{ds} µs, quanta +{dq} µs");
    }
}
