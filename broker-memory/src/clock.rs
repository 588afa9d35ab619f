//! [`QuantaClock`], the default clock of [`crate::MemoryBackend`]: the same
//! time as [`broker_core::SystemClock`], cheaper to read.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use broker_core::clock::micros;
use broker_core::{Clock, Micros};

/// A monotonic clock read from the CPU's time-stamp counter through
/// [`quanta`] (which uses the operating system's monotonic clock instead
/// where the counter is not invariant). Like [`broker_core::SystemClock`] it
/// counts microseconds since the Unix epoch as read once at construction;
/// reading it costs a counter read and a multiply instead of a
/// `clock_gettime` call, which matters on the in-memory hot path.
///
/// The counter's calibration runs once per process, on first use.
///
/// ```
/// use broker_core::Clock;
/// use broker_memory::QuantaClock;
/// let clock = QuantaClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone)]
#[repr(C)]
pub struct QuantaClock {
    // `repr(C)`, in this order: what a reading uses on the counter comes
    // first, in 25 bytes, and quanta's clock (40 bytes, read only where the
    // counter is not the time-stamp counter) is boxed, so that a store
    // keeps its clock and more on one cache line (see `Store`).
    origin: u64,
    origin_unix: Micros,
    /// µs per counter tick, times 2^[`SHIFT`], from quanta's calibration.
    micros_per_tick: u64,
    /// Whether the counter quanta reads is the time-stamp counter, read
    /// here in line.
    tsc: bool,
    clock: Box<quanta::Clock>,
}

/// The fixed point of [`QuantaClock::micros_per_tick`]: 2^-40 of a µs per
/// tick, a relative precision of about 2e-9 at a counter of a few GHz.
const SHIFT: u32 = 40;

/// One calibrated clock per process (calibration takes a few milliseconds).
fn calibrated() -> quanta::Clock {
    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new).clone()
}

/// Whether `clock` reads the time-stamp counter: its reading falls between
/// two reads of the counter, every time. (Its other source, the operating
/// system's monotonic clock in nanoseconds, runs apart from the counter.)
#[cfg(target_arch = "x86_64")]
fn reads_the_tsc(clock: &quanta::Clock) -> bool {
    (0..3).all(|_| {
        let before = tsc();
        let raw = clock.raw();
        before <= raw && raw <= tsc()
    })
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` is on every x86-64 processor.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn reads_the_tsc(_: &quanta::Clock) -> bool {
    false
}

impl QuantaClock {
    /// A clock anchored at the current system time.
    pub fn new() -> Self {
        let clock = calibrated();
        let tsc = reads_the_tsc(&clock);
        let origin_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(micros)
            .unwrap_or(0);
        // quanta's nanoseconds for 2^SHIFT ticks, over 1000: µs per tick
        // times 2^SHIFT.
        let micros_per_tick = clock.delta_as_nanos(0, 1 << SHIFT) / 1000;
        Self {
            origin: clock.raw(),
            clock: Box::new(clock),
            tsc,
            origin_unix,
            micros_per_tick,
        }
    }

    /// The counter, read in line when it is the time-stamp counter.
    #[inline(always)]
    fn raw(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            return tsc();
        }
        self.clock.raw()
    }

    /// `ticks` of the counter in µs.
    #[inline(always)]
    fn micros(&self, ticks: u64) -> Micros {
        ((u128::from(ticks) * u128::from(self.micros_per_tick)) >> SHIFT) as Micros
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    /// The counter's ticks since construction, scaled to µs in one
    /// multiplication (no division by 1000 after quanta's scaling to ns).
    #[inline]
    fn now(&self) -> Micros {
        self.origin_unix + self.micros(self.raw().saturating_sub(self.origin))
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
        // A counter read at another scale than the one calibrated (the
        // time-stamp counter taken for nanoseconds, say) would run 2-3
        // times too fast or too slow over the 100 ms.
        let system = broker_core::SystemClock::new();
        let quanta = QuantaClock::new();
        let (s0, q0) = (system.now(), quanta.now());
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (s1, q1) = (system.now(), quanta.now());
        let (ds, dq) = (s1 - s0, q1 - q0);
        assert!(ds.abs_diff(dq) < 10_000, "system +{ds} µs, quanta +{dq} µs");
    }

    #[test]
    fn scales_ticks_to_the_micros_quanta_gives() {
        let c = QuantaClock::new();
        // From a tick to a day of ticks past the origin, the µs this
        // clock counts are quanta's µs, up to 1 µs (rounding) and 1e-8 of
        // the span (the fixed point).
        let nanos_per_tick = c.clock.delta_as_nanos(0, 1 << SHIFT) as f64 / (1u64 << SHIFT) as f64;
        for ticks in [
            1u64,
            1_000,
            1 << 20,
            1 << 32,
            (86_400e9 / nanos_per_tick) as u64,
        ] {
            let ours = c.micros(ticks);
            let theirs = c.clock.delta_as_nanos(c.origin, c.origin + ticks) / 1000;
            let slack = 1 + theirs / 100_000_000;
            assert!(
                ours.abs_diff(theirs) <= slack,
                "{ticks} ticks: {ours} vs {theirs} µs"
            );
        }
    }
}
