//! An optional pacing margin `m`: every period stretched by `1 / (1 - m)`,
//! bursts unchanged, so varying latency cannot bunch requests past a limit.

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

/// `limits` paced `margin` under (unchanged for 0 or an invalid margin).
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
    let mut out = limits.clone();
    if margin > 0.0 && validate(margin).is_ok() {
        for r in &mut out.rates {
            let stretched = r.period.as_secs_f64() / (1.0 - margin);
            r.period = Duration::from_micros((stretched * 1e6).ceil() as u64);
        }
    }
    out
}
