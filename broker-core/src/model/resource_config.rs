//! Settings of a resource used with `enqueue`: its limits, queue capacity,
//! lease lifetime, longest hold, retry policy and pacing margin.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::limits::Limits;
use super::pacing;
use super::retry::RetryPolicy;
use super::time::micros;

/// Settings of a resource used with `enqueue` (and `try_acquire`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    try_from = "RawResourceConfig"
)]
pub struct ResourceConfig {
    /// The limits.
    pub limits: Limits,
    /// At most this many `enqueue` calls waiting at once; more get
    /// `QueueFull` at once. A call keeps its place while it runs and
    /// between its retries (it counts as waiting again then), so the
    /// calls waiting can exceed this by the number retrying; no new call
    /// is let in while they do.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: usize,
    /// On a store shared by processes (Redis), a concurrency lease not
    /// released or renewed within this time expires (its holder died): the
    /// broker renews the leases of its live permits three times per
    /// `lease_ttl`, so a hold may last longer. There, registration refuses
    /// a TTL under 30 ms (renewals come at most every 10 ms, and a shorter
    /// lease would expire under a live permit). On the in-memory store a
    /// lease ends only when its permit is released or dropped (see
    /// [`crate::LocalStore`]).
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How long a permit may hold its concurrency slot (`maxHold`, 1 h by
    /// default): on a store shared by processes (Redis), its lease is
    /// renewed for at most this long, then expires within `lease_ttl`, so a
    /// permit never released (`std::mem::forget`) frees its slot.
    #[serde(default = "default_max_hold", with = "humantime_serde")]
    pub max_hold: Duration,
    /// How `enqueue` retries.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Spend this fraction under every rate (0 to 0.5, default 0): absorbs
    /// the drift between our send time and the upstream's receive time
    /// (see [`crate::pacing`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pacing_margin: f64,
    /// How long an `enqueue` call may wait for its turn by default (a
    /// call's `Target::deadline` overrides it); `None` (the default): as
    /// long as the queue holds it. Written as a duration: `queueDeadline:
    /// "30s"`.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub queue_deadline: Option<Duration>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// [`ResourceConfig`] as written, before validation.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawResourceConfig {
    limits: Limits,
    #[serde(default = "default_queue_capacity")]
    queue_capacity: usize,
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    lease_ttl: Duration,
    #[serde(default = "default_max_hold", with = "humantime_serde")]
    max_hold: Duration,
    #[serde(default)]
    retry: RetryPolicy,
    #[serde(default)]
    pacing_margin: f64,
    #[serde(default, with = "humantime_serde")]
    queue_deadline: Option<Duration>,
}

impl TryFrom<RawResourceConfig> for ResourceConfig {
    type Error = ConfigError;

    fn try_from(raw: RawResourceConfig) -> Result<Self, ConfigError> {
        let config = ResourceConfig {
            limits: raw.limits,
            queue_capacity: raw.queue_capacity,
            lease_ttl: raw.lease_ttl,
            max_hold: raw.max_hold,
            retry: raw.retry,
            pacing_margin: raw.pacing_margin,
            queue_deadline: raw.queue_deadline,
        };
        config.validate()?;
        Ok(config)
    }
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

    /// Sets how long an `enqueue` call may wait for its turn by default
    /// (see [`ResourceConfig::queue_deadline`]).
    pub fn queue_deadline(mut self, deadline: Duration) -> Self {
        self.queue_deadline = Some(deadline);
        self
    }

    /// Sets the pacing margin (see [`crate::pacing`]).
    pub fn pacing_margin(mut self, margin: f64) -> Self {
        self.pacing_margin = margin;
        self
    }

    /// The limits the buckets enforce: [`ResourceConfig::limits`] paced
    /// [`ResourceConfig::pacing_margin`] under.
    pub fn paced_limits(&self) -> Limits {
        pacing::paced(&self.limits, self.pacing_margin)
    }

    /// Sets the queue capacity.
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n;
        self
    }

    /// Sets how long a permit's lease is renewed at most (see
    /// [`ResourceConfig::max_hold`]).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// Sets the retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Checks the limits and settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.validate()?;
        if self.queue_capacity == 0 {
            return Err(ConfigError::NotPositive {
                field: "queueCapacity".into(),
                value: "0".into(),
            });
        }
        // Counted in whole µs: a shorter one would let every lease expire
        // at once (no concurrency limit at all).
        if micros(self.lease_ttl) == 0 {
            return Err(ConfigError::NotPositive {
                field: "leaseTtl".into(),
                value: format!("{:?}", self.lease_ttl),
            });
        }
        if self.max_hold.is_zero() {
            return Err(ConfigError::NotPositive {
                field: "maxHold".into(),
                value: format!("{:?}", self.max_hold),
            });
        }
        if self.queue_deadline.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::NotPositive {
                field: "queueDeadline".into(),
                value: "0s".into(),
            });
        }
        pacing::validate(self.pacing_margin)?;
        self.retry.validate()
    }
}
