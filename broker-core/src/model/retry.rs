//! Outcomes of upstream work and the retry policy `enqueue` applies to them:
//! 429 and transient failures retry, fatal ones never.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::limits::{Cost, Limits, Unit};
use super::observed::ObservedLimit;
use super::time::micros;

/// What one attempt of the work reports back.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<T, E> {
    /// Success, with the actual cost when known only afterwards.
    Ok {
        /// The result.
        value: T,
        /// Actual cost, settled against the booked one.
        usage: Option<Cost>,
        /// Rate-limit headers of the response, reconciled into the bucket.
        observed: Option<ObservedLimit>,
    },
    /// The upstream answered 429 (or an equivalent).
    RateLimited {
        /// The upstream's error.
        error: E,
        /// `Retry-After`, if given.
        retry_after: Option<Duration>,
        /// Rate-limit headers of the response.
        observed: Option<ObservedLimit>,
    },
    /// A 5xx or a network error: retry after a short backoff.
    Transient {
        /// The upstream's (or the network's) error.
        error: E,
        /// Rate-limit headers of the response, if any.
        observed: Option<ObservedLimit>,
    },
    /// 401/403/404, bad request: never retried.
    Fatal {
        /// The upstream's error.
        error: E,
        /// Rate-limit headers of the response, reconciled like any other.
        observed: Option<ObservedLimit>,
    },
}

impl<T, E> Outcome<T, E> {
    /// Success with no usage or headers.
    pub fn ok(value: T) -> Self {
        Outcome::Ok {
            value,
            usage: None,
            observed: None,
        }
    }

    /// Success whose actual cost was `usage`.
    pub fn ok_with_usage(value: T, usage: Cost) -> Self {
        Outcome::Ok {
            value,
            usage: Some(usage),
            observed: None,
        }
    }

    /// A 429 with an optional `Retry-After`.
    pub fn rate_limited(error: E, retry_after: Option<Duration>) -> Self {
        Outcome::RateLimited {
            error,
            retry_after,
            observed: None,
        }
    }

    /// A failure of `class` with the response's headers; an `Ok` class
    /// becomes [`Outcome::Fatal`].
    ///
    /// ```
    /// use broker_core::{headers, Outcome, OutcomeClass};
    /// use http::HeaderMap;
    /// let mut h = HeaderMap::new();
    /// h.insert("retry-after", "7".parse().unwrap());
    /// let seen = headers::parse(&h, std::time::SystemTime::now());
    /// let o: Outcome<(), &str> = Outcome::failed(OutcomeClass::from_status(429), "slow down", Some(seen));
    /// assert_eq!(o.retry_after(), Some(std::time::Duration::from_secs(7)));
    /// ```
    pub fn failed(class: OutcomeClass, error: E, observed: Option<ObservedLimit>) -> Self {
        match class {
            OutcomeClass::RateLimited => Outcome::RateLimited {
                error,
                retry_after: observed.as_ref().and_then(|o| o.retry_after),
                observed,
            },
            OutcomeClass::Transient => Outcome::Transient { error, observed },
            OutcomeClass::Ok | OutcomeClass::Fatal => Outcome::Fatal { error, observed },
        }
    }

    /// Attaches the response's rate-limit headers, whatever its status.
    pub fn with_observed(mut self, seen: ObservedLimit) -> Self {
        match &mut self {
            Outcome::Ok { observed, .. }
            | Outcome::RateLimited { observed, .. }
            | Outcome::Transient { observed, .. }
            | Outcome::Fatal { observed, .. } => *observed = Some(seen),
        }
        self
    }

    /// The response's rate-limit headers, if attached.
    pub fn observed(&self) -> Option<&ObservedLimit> {
        match self {
            Outcome::Ok { observed, .. }
            | Outcome::RateLimited { observed, .. }
            | Outcome::Transient { observed, .. }
            | Outcome::Fatal { observed, .. } => observed.as_ref(),
        }
    }

    /// The delay the upstream asked for, on a 429 or a transient failure.
    pub fn retry_after(&self) -> Option<Duration> {
        let asked = self.observed().and_then(|o| o.retry_after);
        match self {
            Outcome::RateLimited { retry_after, .. } => retry_after.or(asked),
            Outcome::Transient { .. } => asked,
            _ => None,
        }
    }

    /// The class of this outcome.
    pub fn class(&self) -> OutcomeClass {
        match self {
            Outcome::Ok { .. } => OutcomeClass::Ok,
            Outcome::RateLimited { .. } => OutcomeClass::RateLimited,
            Outcome::Transient { .. } => OutcomeClass::Transient,
            Outcome::Fatal { .. } => OutcomeClass::Fatal,
        }
    }
}

/// The class of an [`Outcome`] (or of an HTTP status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    /// Success.
    Ok,
    /// 429.
    RateLimited,
    /// 5xx, timeouts, connection errors.
    Transient,
    /// Everything that a retry cannot fix.
    Fatal,
}

impl OutcomeClass {
    /// Rate limits and transient failures are retried.
    pub fn is_retryable(self) -> bool {
        matches!(self, OutcomeClass::RateLimited | OutcomeClass::Transient)
    }

    /// 429 rate limited, 408 and 5xx transient, other 4xx fatal, else ok.
    pub fn from_status(status: u16) -> Self {
        match status {
            429 => OutcomeClass::RateLimited,
            408 | 500..=599 => OutcomeClass::Transient,
            400..=499 => OutcomeClass::Fatal,
            _ => OutcomeClass::Ok,
        }
    }
}

/// How `enqueue` retries, and the pauses for callers with their own loop.
///
/// ```
/// use broker_core::RetryPolicy;
/// assert!(RetryPolicy { max_attempts: 0, ..Default::default() }.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Total attempts allowed (the retry budget), at least 1.
    pub max_attempts: u32,
    /// First step of the exponential backoff.
    #[serde(with = "humantime_serde")]
    pub base_backoff: Duration,
    /// The configured wait ceiling (see [`RetryPolicy::ceiling`]).
    #[serde(with = "humantime_serde")]
    pub wait_ceiling: Duration,
    /// N in `N × longest window + margin`.
    pub ceiling_windows: u32,
    /// The margin in `N × longest window + margin`.
    #[serde(with = "humantime_serde")]
    pub ceiling_margin: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_backoff: Duration::from_millis(100),
            wait_ceiling: Duration::from_secs(60),
            ceiling_windows: 2,
            ceiling_margin: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// Checks the policy.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::not_positive("retry.maxAttempts", "0"));
        }
        if self.base_backoff.is_zero() {
            return Err(ConfigError::not_positive("retry.baseBackoff", "0s"));
        }
        Ok(())
    }

    /// `max(wait_ceiling, N × longest window + margin, one token's refill)`:
    /// bounds a penalty and every retry pause.
    ///
    /// ```
    /// use broker_core::{Limits, RateLimit, RetryPolicy};
    /// use std::time::Duration;
    /// let limits = Limits::new().rate(RateLimit::per_minute(60));
    /// assert_eq!(RetryPolicy::default().ceiling(&limits), Duration::from_secs(121));
    /// ```
    pub fn ceiling(&self, limits: &Limits) -> Duration {
        let longest = limits.rates.iter().map(|r| r.period).max();
        let windows = longest
            .unwrap_or_default()
            .saturating_mul(self.ceiling_windows);
        self.wait_ceiling
            .max(windows.saturating_add(self.ceiling_margin))
            .max(refill_one_token(limits))
    }

    /// The pause before retrying after `attempt` ended in `class`, or `None`
    /// when not retried.
    ///
    /// ```
    /// use broker_core::{Limits, OutcomeClass, RateLimit, RetryPolicy};
    /// use std::time::Duration;
    /// let limits = Limits::new().rate(RateLimit::per_minute(1));
    /// let p = RetryPolicy::default();
    /// let pause = p.pause(OutcomeClass::RateLimited, 1, Some(Duration::from_secs(1)), &limits);
    /// assert_eq!(pause, Some(Duration::from_secs(60)));
    /// assert_eq!(p.pause(OutcomeClass::Fatal, 1, None, &limits), None);
    /// ```
    pub fn pause(
        &self,
        class: OutcomeClass,
        attempt: u32,
        retry_after: Option<Duration>,
        limits: &Limits,
    ) -> Option<Duration> {
        if !class.is_retryable() || attempt >= self.max_attempts {
            return None;
        }
        if class == OutcomeClass::RateLimited {
            return Some(self.rate_limited_pause(attempt, retry_after, limits));
        }
        // Transient: random in `[0, min(exponential, ceiling)]`, at least the asked delay.
        use rand::Rng;
        let ceiling = self.ceiling(limits);
        let cap = micros(self.exponential(attempt).min(ceiling));
        let jitter = Duration::from_micros(rand::thread_rng().gen_range(0..=cap));
        Some(jitter.max(retry_after.unwrap_or_default().min(ceiling)))
    }

    /// Exponential step for `attempt` (1-based): `base × 2^(attempt-1)`.
    fn exponential(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(30);
        self.base_backoff.saturating_mul(1 << shift)
    }

    /// Pause after a 429 on `attempt`:
    /// `min(max(retry_after, refill_one_token, exponential), ceiling)`.
    pub fn rate_limited_pause(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        limits: &Limits,
    ) -> Duration {
        retry_after
            .unwrap_or_default()
            .max(refill_one_token(limits))
            .max(self.exponential(attempt))
            .min(self.ceiling(limits))
    }
}

/// Time to refill one request token in the slowest request-rate limit.
fn refill_one_token(limits: &Limits) -> Duration {
    limits
        .rates
        .iter()
        .filter(|r| r.unit == Unit::Requests)
        .map(|r| r.period / u32::try_from(r.amount).unwrap_or(u32::MAX).max(1))
        .max()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RateLimit;

    #[test]
    fn short_retry_after_is_raised_to_one_token() {
        let limits = Limits::new().rate(RateLimit::per_minute(1));
        let p = RetryPolicy::default();
        let pause = p.rate_limited_pause(1, Some(Duration::from_secs(1)), &limits);
        assert_eq!(pause, Duration::from_secs(60));
    }

    #[test]
    fn a_429_pause_grows_exponentially_past_retry_after_and_refill() {
        // One token's refill: 100 ms; ceiling: max(60 s, 2 × 1 s + 1 s).
        let limits = Limits::new().rate(RateLimit::per_second(10));
        let p = RetryPolicy::default();
        let retry_after = Some(Duration::from_millis(150));
        let pauses: Vec<_> = (1..=6)
            .map(|n| p.rate_limited_pause(n, retry_after, &limits))
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(
            pauses,
            [ms(150), ms(200), ms(400), ms(800), ms(1_600), ms(3_200)]
        );
        assert_eq!(
            p.rate_limited_pause(20, retry_after, &limits),
            p.ceiling(&limits),
            "the exponential step stops at the ceiling"
        );
    }

    #[test]
    fn every_pause_is_bounded_by_the_ceiling() {
        let limits = Limits::new().rate(RateLimit::per_second(10));
        let p = RetryPolicy {
            max_attempts: u32::MAX,
            ..RetryPolicy::default()
        };
        let ceiling = p.ceiling(&limits);
        for attempt in 1..40 {
            assert!(
                p.rate_limited_pause(attempt, Some(Duration::from_secs(3600)), &limits) <= ceiling
            );
            let jittered = p.pause(OutcomeClass::Transient, attempt, None, &limits);
            assert!(jittered.unwrap() <= ceiling);
        }
    }

    #[test]
    fn a_transient_failure_waits_at_least_its_retry_after() {
        let limits = Limits::new().rate(RateLimit::per_second(10));
        let p = RetryPolicy::default();
        let transient = OutcomeClass::Transient;
        for attempt in 1..4 {
            let asked = Some(Duration::from_secs(30));
            let pause = p.pause(transient, attempt, asked, &limits).unwrap();
            assert_eq!(pause, Duration::from_secs(30), "attempt {attempt}");
            let beyond = Some(Duration::from_secs(3600));
            let pause = p.pause(transient, attempt, beyond, &limits).unwrap();
            assert_eq!(pause, p.ceiling(&limits), "attempt {attempt}");
            let jittered = p.pause(transient, attempt, None, &limits).unwrap();
            assert!(jittered <= p.exponential(attempt), "attempt {attempt}");
        }
        let seen = crate::observed::ObservedLimit {
            retry_after: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        let unavailable: Outcome<(), &str> = Outcome::failed(transient, "503", Some(seen.clone()));
        assert_eq!(unavailable.retry_after(), Some(Duration::from_secs(30)));
        let fatal: Outcome<(), &str> = Outcome::failed(OutcomeClass::Fatal, "403", Some(seen));
        assert_eq!(fatal.retry_after(), None);
    }

    #[test]
    fn only_rate_limits_and_transients_retry() {
        assert!(OutcomeClass::from_status(429).is_retryable());
        assert!(OutcomeClass::from_status(503).is_retryable());
        assert!(!OutcomeClass::from_status(401).is_retryable());
        assert!(!OutcomeClass::from_status(404).is_retryable());
        assert!(!OutcomeClass::from_status(200).is_retryable());
    }
}
