//! Time in the model: whole microseconds, and the rounding of a wait.

use std::time::Duration;

/// A point in time, in microseconds since a clock-defined origin.
pub type Micros = u64;

/// Converts a [`Duration`] to whole microseconds, saturating.
///
/// ```
/// use broker_core::clock::micros;
/// assert_eq!(micros(std::time::Duration::from_millis(3)), 3_000);
/// ```
pub fn micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Rounds a wait up to a whole µs, but within 1 ns of one down (float noise);
/// 0 for no positive number.
///
/// ```
/// use broker_core::bucket::ceil_micros;
/// assert_eq!((ceil_micros(2.0004), ceil_micros(2.5), ceil_micros(-1.0)), (2, 3, 0));
/// ```
pub fn ceil_micros(x: f64) -> Micros {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let whole = x as Micros;
    whole.saturating_add(u64::from(x - whole as f64 >= 1e-3))
}
