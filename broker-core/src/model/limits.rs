//! Limits of a resource and the cost of one acquisition.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::bucket::BucketParams;
use super::error::{BrokerError, ConfigError};
use super::time::micros;

/// What a rate limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Requests (calls): every acquisition costs [`Cost::requests`] of these.
    #[default]
    Requests,
    /// Tokens (e.g. LLM tokens): every acquisition costs [`Cost::tokens`].
    Tokens,
}

impl Unit {
    /// `"requests"` or `"tokens"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
        }
    }
}

/// `amount` per `period`, with at most `burst` at once, counting `unit`.
///
/// ```
/// use broker_core::{RateLimit, Unit};
/// use std::time::Duration;
/// let rpm = RateLimit::per(60, Duration::from_secs(60)).with_burst(10);
/// assert_eq!(rpm.burst(), 10);
/// assert_eq!(RateLimit::per(90_000, Duration::from_secs(60)).unit(Unit::Tokens).burst(), 90_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// How many units are refilled per `period`.
    pub amount: u64,
    /// The refill period.
    #[serde(with = "humantime_serde")]
    pub period: Duration,
    /// Bucket capacity; `None` means `amount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// What is counted.
    #[serde(default)]
    pub unit: Unit,
}

impl RateLimit {
    /// `amount` requests per `period`, burst `amount`.
    pub fn per(amount: u64, period: Duration) -> Self {
        Self {
            amount,
            period,
            burst: None,
            unit: Unit::Requests,
        }
    }

    /// `amount` requests per second.
    pub fn per_second(amount: u64) -> Self {
        Self::per(amount, Duration::from_secs(1))
    }

    /// `amount` requests per minute.
    pub fn per_minute(amount: u64) -> Self {
        Self::per(amount, Duration::from_secs(60))
    }

    /// Sets the bucket capacity.
    pub fn with_burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Sets the unit counted.
    pub fn unit(mut self, unit: Unit) -> Self {
        self.unit = unit;
        self
    }

    /// The bucket capacity.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.amount)
    }

    /// Checks amount, period and burst; `field` is the path for messages.
    pub fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let at = |name| format!("{field}.{name}");
        let at_most = |name, v: u64| {
            let reason = format!("must be at most {MAX_AMOUNT} (got {v})");
            (v > MAX_AMOUNT).then(|| ConfigError::invalid(at(name), reason))
        };
        let period = format!("{:?}", self.period);
        [
            (self.amount == 0).then(|| ConfigError::not_positive(at("amount"), "0")),
            (micros(self.period) == 0).then(|| ConfigError::not_positive(at("period"), period)),
            (self.burst == Some(0)).then(|| ConfigError::not_positive(at("burst"), "0")),
            at_most("amount", self.amount),
            at_most("burst", self.burst()),
            (self.period > MAX_PERIOD)
                .then(|| ConfigError::invalid(at("period"), "must be at most 366 days")),
        ]
        .into_iter()
        .flatten()
        .next()
        .map_or(Ok(()), Err)
    }

    /// The bucket parameters, the period rounded up to a whole µs.
    pub fn params(&self) -> BucketParams {
        BucketParams::new(
            self.burst() as f64,
            self.amount as f64,
            self.period.as_nanos().div_ceil(1_000) as f64,
        )
    }
}

/// Largest amount or burst accepted (keeps all bucket arithmetic exact in f64).
pub const MAX_AMOUNT: u64 = 1 << 40;
/// Longest period accepted.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// All limits of one resource: rate limits and an optional concurrency
/// limit; written with shorthands too (a `null` limit is refused).
///
/// ```
/// use broker_core::{Limits, RateLimit};
/// let l = Limits::new().rate(RateLimit::per_second(5)).max_concurrent(2);
/// assert!(l.validate().is_ok());
/// let limits: Limits = serde_json::from_str(
///     r#"{"requestsPerSecond": 100, "maxConcurrentRequests": 200}"#).unwrap();
/// assert_eq!((limits.rates[0].amount, limits.max_concurrent), (100, Some(200)));
/// let err = serde_json::from_str::<Limits>(r#"{"requestsPerSecond": 0}"#).unwrap_err();
/// assert!(err.to_string().contains("requestsPerSecond"));
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "LimitsConfig")]
pub struct Limits {
    /// Rate limits; all must pass.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rates: Vec<RateLimit>,
    /// At most this many permits held at once.
    #[serde(
        rename = "maxConcurrentRequests",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrent: Option<u32>,
}

impl Limits {
    /// No limits (everything passes).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rate limit.
    pub fn rate(mut self, rate: RateLimit) -> Self {
        self.rates.push(rate);
        self
    }

    /// Sets the concurrency limit.
    pub fn max_concurrent(mut self, n: u32) -> Self {
        self.max_concurrent = Some(n);
        self
    }

    /// Checks every limit.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, r) in self.rates.iter().enumerate() {
            r.validate(&format!("rates[{i}]"))?;
        }
        if self.max_concurrent == Some(0) {
            return Err(ConfigError::not_positive("maxConcurrent", "0"));
        }
        Ok(())
    }

    /// Checks that `cost` can ever be granted: no part larger than a burst.
    pub fn check_fits(&self, resource: &str, cost: Cost) -> Result<(), BrokerError> {
        for r in &self.rates {
            let c = cost.of(r.unit);
            if c > r.burst() {
                return Err(BrokerError::CostNeverFits {
                    resource: resource.to_owned(),
                    cost: c,
                    unit: r.unit.as_str(),
                    burst: r.burst(),
                });
            }
        }
        Ok(())
    }
}

/// What one acquisition costs: requests (default 1) and tokens (default 0).
///
/// ```
/// use broker_core::Cost;
/// assert_eq!(Cost::default(), Cost::requests(1));
/// assert_eq!(Cost::tokens(500).requests, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cost {
    /// Requests counted against `requests` limits.
    pub requests: u64,
    /// Tokens counted against `tokens` limits.
    pub tokens: u64,
}

impl Default for Cost {
    fn default() -> Self {
        Self::requests(1)
    }
}

impl Cost {
    /// `n` requests, no tokens.
    pub fn requests(n: u64) -> Self {
        Self {
            requests: n,
            tokens: 0,
        }
    }

    /// One request carrying `n` tokens.
    pub fn tokens(n: u64) -> Self {
        Self {
            requests: 1,
            tokens: n,
        }
    }

    /// The part of this cost counted in `unit`.
    pub fn of(&self, unit: Unit) -> u64 {
        match unit {
            Unit::Requests => self.requests,
            Unit::Tokens => self.tokens,
        }
    }
}

/// How [`Limits`] are written: shorthands and explicit `rates`; a limit
/// written as `null` is refused with its path, not read as none.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LimitsConfig {
    #[serde(default, deserialize_with = "written")]
    requests_per_second: Option<u64>,
    #[serde(default, deserialize_with = "written")]
    requests_per_minute: Option<u64>,
    #[serde(default, deserialize_with = "written")]
    tokens_per_minute: Option<u64>,
    #[serde(default, alias = "maxConcurrent", deserialize_with = "written")]
    max_concurrent_requests: Option<u32>,
    #[serde(default)]
    rates: Vec<RateLimit>,
}

/// A limit that is written: `null` is refused.
fn written<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    de: D,
) -> Result<Option<T>, D::Error> {
    let null = "null sets no limit: write a number, or leave the field out";
    (Option::<T>::deserialize(de)?.map(Some)).ok_or_else(|| serde::de::Error::custom(null))
}

impl TryFrom<LimitsConfig> for Limits {
    type Error = ConfigError;

    fn try_from(c: LimitsConfig) -> Result<Self, ConfigError> {
        for (i, rate) in c.rates.iter().enumerate() {
            rate.validate(&format!("rates[{i}]"))?;
        }
        use Unit::{Requests, Tokens};
        let mut rates = Vec::new();
        for (field, amount, secs, unit) in [
            ("requestsPerSecond", c.requests_per_second, 1, Requests),
            ("requestsPerMinute", c.requests_per_minute, 60, Requests),
            ("tokensPerMinute", c.tokens_per_minute, 60, Tokens),
        ] {
            let Some(amount) = amount else { continue };
            let rate = RateLimit::per(amount, Duration::from_secs(secs)).unit(unit);
            // Named by the shorthand alone (`validate` only makes `Invalid`).
            if let Err(ConfigError::Invalid { reason, .. }) = rate.validate(field) {
                return Err(ConfigError::invalid(field, reason));
            }
            rates.push(rate);
        }
        if c.max_concurrent_requests == Some(0) {
            return Err(ConfigError::not_positive("maxConcurrentRequests", "0"));
        }
        rates.extend(c.rates);
        Ok(Limits {
            rates,
            max_concurrent: c.max_concurrent_requests,
        })
    }
}
