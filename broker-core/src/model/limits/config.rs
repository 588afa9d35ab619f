//! How [`Limits`] are written: shorthands or explicit `rates`.

use std::time::Duration;

use serde::Deserialize;

use super::{Limits, RateLimit, Unit};
use crate::model::error::ConfigError;

/// How [`Limits`] are written: shorthands and explicit `rates`; a limit
/// written as `null` is refused with its path, not read as none.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct LimitsConfig {
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
