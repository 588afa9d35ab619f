//! An optional pacing margin: spend slightly under the upstream's limit, as
//! varying latency can bunch requests sent one refill apart. A margin `m`
//! stretches every period by `1 / (1 - m)`; bursts are unchanged.

use std::time::Duration;

use super::error::ConfigError;
use super::limits::Limits;

/// The largest margin accepted (spend at least half of the limit).
pub const MAX_MARGIN: f64 = 0.5;

/// Checks a margin: a number in `[0, 0.5]`.
pub fn validate(margin: f64) -> Result<(), ConfigError> {
    if !(0.0..=MAX_MARGIN).contains(&margin) {
        return Err(ConfigError::invalid(
            "pacingMargin",
            format!("must be a fraction between 0 and {MAX_MARGIN} (got {margin})"),
        ));
    }
    Ok(())
}

/// `limits` paced `margin` under: every period stretched by `1 / (1 - margin)`.
/// A margin of 0 (or an invalid one) returns the limits unchanged.
///
/// ```
/// use broker_core::{pacing, Limits, RateLimit};
/// use std::time::Duration;
/// let limits = Limits::new().rate(RateLimit::per_minute(60));
/// let paced = pacing::paced(&limits, 0.05);
/// assert_eq!(paced.rates[0].amount, 60);
/// assert_eq!(paced.rates[0].period.as_millis(), 63_157);
/// assert_eq!(paced.rates[0].burst(), 60);
/// ```
pub fn paced(limits: &Limits, margin: f64) -> Limits {
    if margin <= 0.0 || validate(margin).is_err() {
        return limits.clone();
    }
    let mut out = limits.clone();
    for r in &mut out.rates {
        let stretched = r.period.as_secs_f64() / (1.0 - margin);
        // Whole microseconds, rounded up: never faster than the margin asks.
        let micros = (stretched * 1e6).ceil();
        r.period = Duration::from_micros(micros as u64);
    }
    out
}
