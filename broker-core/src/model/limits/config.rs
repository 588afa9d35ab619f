//! The serialized form of [`Limits`]: shorthands or explicit `rates`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Limits, RateLimit, Unit};
use crate::model::error::ConfigError;

/// The serialized form of [`Limits`].
///
/// ```
/// use broker_core::Limits;
/// let limits: Limits = serde_json::from_str(
///     r#"{"requestsPerSecond": 100, "maxConcurrentRequests": 200}"#).unwrap();
/// assert_eq!(limits.rates[0].amount, 100);
/// assert_eq!(limits.max_concurrent, Some(200));
/// let err = serde_json::from_str::<Limits>(r#"{"requestsPerSecond": 0}"#).unwrap_err();
/// assert!(err.to_string().contains("requestsPerSecond"));
/// ```
///
/// A limit written as `null` is refused with its path, not read as none.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitsConfig {
    /// Shorthand: this many requests per second.
    #[serde(
        default,
        deserialize_with = "written",
        skip_serializing_if = "Option::is_none"
    )]
    pub requests_per_second: Option<u64>,
    /// Shorthand: this many requests per minute.
    #[serde(
        default,
        deserialize_with = "written",
        skip_serializing_if = "Option::is_none"
    )]
    pub requests_per_minute: Option<u64>,
    /// Shorthand: this many tokens per minute.
    #[serde(
        default,
        deserialize_with = "written",
        skip_serializing_if = "Option::is_none"
    )]
    pub tokens_per_minute: Option<u64>,
    /// At most this many in flight at once.
    #[serde(
        default,
        alias = "maxConcurrent",
        deserialize_with = "written",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrent_requests: Option<u32>,
    /// Explicit rate limits, in addition to the shorthands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rates: Vec<RateLimit>,
}

/// A limit that is written: `null` is refused.
fn written<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    match Option::<T>::deserialize(de)? {
        Some(v) => Ok(Some(v)),
        None => Err(serde::de::Error::custom(
            "null sets no limit: write a number, or leave the field out",
        )),
    }
}

impl TryFrom<LimitsConfig> for Limits {
    type Error = ConfigError;

    fn try_from(c: LimitsConfig) -> Result<Self, ConfigError> {
        let mut rates = Vec::new();
        use Unit::{Requests, Tokens};
        let shorthands = [
            ("requestsPerSecond", c.requests_per_second, 1, Requests),
            ("requestsPerMinute", c.requests_per_minute, 60, Requests),
            ("tokensPerMinute", c.tokens_per_minute, 60, Tokens),
        ];
        for (i, rate) in c.rates.iter().enumerate() {
            rate.validate(&format!("rates[{i}]"))?;
        }
        for (field, amount, secs, unit) in shorthands {
            let Some(amount) = amount else { continue };
            let rate = RateLimit::per(amount, Duration::from_secs(secs)).unit(unit);
            rate.validate(field).map_err(|e| match e {
                ConfigError::Invalid { reason, .. } => ConfigError::invalid(field, reason),
                other => other,
            })?;
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

impl From<Limits> for LimitsConfig {
    fn from(l: Limits) -> Self {
        Self {
            max_concurrent_requests: l.max_concurrent,
            rates: l.rates,
            ..Self::default()
        }
    }
}
