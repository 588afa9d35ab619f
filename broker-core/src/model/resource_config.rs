//! Settings of a resource: its limits, queue capacity, lease lifetime,
//! longest hold, retry policy and pacing margin.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::ConfigError;
use super::limits::Limits;
use super::retry::RetryPolicy;
use super::time::micros;

/// Settings of a resource used with `enqueue` (and `try_acquire`); read
/// from a document, it is validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceConfig {
    /// The limits.
    pub limits: Limits,
    /// At most this many `enqueue` calls waiting at once (a call retrying
    /// counts as waiting); more get `QueueFull` at once.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: usize,
    /// On a store shared by processes, a lease not released or renewed
    /// within this time expires; the broker renews live permits' leases
    /// three times per `lease_ttl` (at least 30 ms there).
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How long a permit's lease is renewed at most (1 h by default), so a
    /// permit never released frees its slot.
    #[serde(default = "default_max_hold", with = "humantime_serde")]
    pub max_hold: Duration,
    /// How `enqueue` retries.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Spend this fraction under every rate (0 to 0.5, default 0; see
    /// [`ResourceConfig::paced_limits`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pacing_margin: f64,
    /// How long an `enqueue` call may wait for its turn by default (a
    /// call's `Target::deadline` overrides it); `None`: no bound.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub queue_deadline: Option<Duration>,
}

impl<'de> Deserialize<'de> for ResourceConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The inherent `deserialize` that `remote = "Self"` derives.
        let config = ResourceConfig::deserialize(d)?;
        config.validate().map_err(serde::de::Error::custom)?;
        Ok(config)
    }
}

impl Serialize for ResourceConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ResourceConfig::serialize(self, s) // the derived one, as above
    }
}

/// The largest pacing margin accepted (spend at least half of the limit).
pub(crate) const MAX_MARGIN: f64 = 0.5;

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn default_queue_capacity() -> usize {
    1024
}

fn default_lease_ttl() -> Duration {
    Duration::from_secs(60)
}

fn default_max_hold() -> Duration {
    Duration::from_secs(3600)
}

impl ResourceConfig {
    /// A config with these limits and default queue, lease and retry settings.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            queue_capacity: default_queue_capacity(),
            lease_ttl: default_lease_ttl(),
            max_hold: default_max_hold(),
            retry: Default::default(),
            pacing_margin: 0.0,
            queue_deadline: None,
        }
    }

    /// The limits the buckets enforce: every period stretched by `1 / (1 - m)`
    /// for the pacing margin `m`, bursts unchanged, so varying latency cannot
    /// bunch requests past a limit (unchanged for 0 or an invalid margin).
    ///
    /// ```
    /// use broker_core::{Limits, RateLimit, ResourceConfig};
    /// let mut config = ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(60)));
    /// config.pacing_margin = 0.05;
    /// let paced = config.paced_limits();
    /// assert_eq!(paced.rates[0].amount, 60);
    /// assert_eq!(paced.rates[0].period.as_millis(), 63_157);
    /// assert_eq!(paced.rates[0].burst(), 60);
    /// ```
    pub fn paced_limits(&self) -> Limits {
        let (mut out, margin) = (self.limits.clone(), self.pacing_margin);
        if margin > 0.0 && margin <= MAX_MARGIN {
            for r in &mut out.rates {
                let stretched = r.period.as_secs_f64() / (1.0 - margin);
                r.period = Duration::from_micros((stretched * 1e6).ceil() as u64);
            }
        }
        out
    }

    /// Checks the limits and settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.validate()?;
        let (ttl, hold) = (self.lease_ttl, self.max_hold);
        let no_deadline = self.queue_deadline.is_some_and(|d| d.is_zero());
        for (field, zero, got) in [
            ("queueCapacity", self.queue_capacity == 0, "0".into()),
            ("leaseTtl", micros(ttl) == 0, format!("{ttl:?}")),
            ("maxHold", hold.is_zero(), format!("{hold:?}")),
            ("queueDeadline", no_deadline, "0s".into()),
        ] {
            if zero {
                return Err(ConfigError::not_positive(field, got));
            }
        }
        let margin = self.pacing_margin;
        if !(0.0..=MAX_MARGIN).contains(&margin) {
            let reason = format!("must be a fraction between 0 and {MAX_MARGIN} (got {margin})");
            return Err(ConfigError::invalid("pacingMargin", reason));
        }
        self.retry.validate()
    }
}
