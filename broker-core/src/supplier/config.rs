//! The supplier config, one file per supplier; every bucket compiles to [`Limits`] and errors
//! name the file and the path:
//!
//! ```yaml
//! rate_limit:
//!   auth:
//!     login: { rate: 1, period: 120s, mode: wait }
//!   data:
//!     price:
//!       rate: 1
//!       period: 1s
//!       mode: skip_and_reschedule
//!       backoff: { initial: 500ms, max: 30s, factor: 2 }
//!   egress_ip: true
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limits::{Limits, RateLimit};

/// What a bucket does when it has no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Block until the token comes; never fail on rate (auth buckets).
    Wait,
    /// Answer at once with the moment to try again (data buckets).
    SkipAndReschedule,
}

/// Backoff of a skip-and-reschedule bucket: after the `n`-th consecutive
/// skip the job is moved by `min(initial × factor^n, max)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// The first delay.
    #[serde(with = "humantime_serde")]
    pub initial: Duration,
    /// The largest delay.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Growth per consecutive skip, at least 1.
    pub factor: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            factor: 2.0,
        }
    }
}

impl Backoff {
    /// The delay after `skips` earlier consecutive skips (0 for the first).
    ///
    /// ```
    /// use broker_core::supplier::Backoff;
    /// use std::time::Duration;
    /// let b = Backoff::default();
    /// assert_eq!(b.delay(0), Duration::from_millis(500));
    /// assert_eq!(b.delay(3), Duration::from_secs(4));
    /// assert_eq!(b.delay(60), Duration::from_secs(30));
    /// // A factor below 1, built in code unchecked, never panics.
    /// let odd = Backoff { factor: -2.0, ..Backoff::default() };
    /// assert_eq!(odd.delay(1), Duration::ZERO);
    /// ```
    pub fn delay(&self, skips: u32) -> Duration {
        let grown = self.initial.as_secs_f64() * self.factor.powi(skips.min(1000) as i32);
        if !grown.is_finite() || grown >= self.max.as_secs_f64() {
            return self.max;
        }
        Duration::from_secs_f64(grown.max(0.0)).min(self.max)
    }

    fn validate(&self) -> Result<(), String> {
        let (initial, max, factor) = (self.initial, self.max, self.factor);
        [
            (initial.is_zero()).then(|| "backoff.initial must be greater than zero".into()),
            (max < initial).then(|| {
                format!("backoff.max ({max:?}) must be at least backoff.initial ({initial:?})")
            }),
            (!factor.is_finite() || factor < 1.0)
                .then(|| format!("backoff.factor must be a number >= 1 (got {factor})")),
        ]
        .into_iter()
        .flatten()
        .next()
        .map_or(Ok(()), Err)
    }
}

/// One bucket as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    rate: u64,
    #[serde(with = "humantime_serde")]
    period: Duration,
    burst: Option<u64>,
    mode: Option<Mode>,
    backoff: Option<Backoff>,
}

/// One bucket: [`AuthBucket`] (always [`Mode::Wait`]: a lost login attempt
/// can cost a ban) or [`DataBucket`] (default [`Mode::SkipAndReschedule`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawBucket")]
pub struct Bucket<const AUTH: bool> {
    /// `rate` per `period`, burst `burst` (default `rate`).
    pub limits: Limits,
    /// What the bucket does when it has no token.
    pub mode: Mode,
    /// Backoff of skipped jobs (default 500ms, ×2, at most 30s).
    pub backoff: Backoff,
}

/// An auth bucket, never sharing budget with data.
pub type AuthBucket = Bucket<true>;
/// A data bucket of one endpoint class.
pub type DataBucket = Bucket<false>;

impl<const AUTH: bool> TryFrom<RawBucket> for Bucket<AUTH> {
    type Error = String;

    fn try_from(raw: RawBucket) -> Result<Self, String> {
        let mode = (raw.mode).unwrap_or(if AUTH {
            Mode::Wait
        } else {
            Mode::SkipAndReschedule
        });
        if AUTH && mode != Mode::Wait {
            return Err(
                "an auth bucket must have mode `wait`: a lost login attempt costs a ban, so auth waits for its token"
                    .into(),
            );
        }
        if mode == Mode::Wait && raw.backoff.is_some() {
            return Err("backoff applies only to skip_and_reschedule buckets".into());
        }
        let backoff = raw.backoff.unwrap_or_default();
        backoff.validate()?;
        let limits = Limits::new().rate(RateLimit {
            burst: raw.burst,
            ..RateLimit::per(raw.rate, raw.period)
        });
        limits.validate().map_err(|e| {
            e.to_string()
                .replace("rates[0].amount", "rate")
                .replace("rates[0].", "")
        })?;
        Ok(Self {
            limits,
            mode,
            backoff,
        })
    }
}

/// The bucket classes of one supplier.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitClasses {
    /// Auth buckets by endpoint class (`login`, ...), one per credential.
    pub auth: BTreeMap<String, AuthBucket>,
    /// Data buckets by endpoint class (`price`, ...), one per credential.
    pub data: BTreeMap<String, DataBucket>,
    /// Count requests per egress IP (an informational bucket: never limits).
    pub egress_ip: bool,
}

/// One supplier's config file, read with [`crate::config::parse`].
///
/// ```
/// use broker_core::config::{parse, Format};
/// use broker_core::supplier::SupplierConfig;
/// let text = "rate_limit:\n  data:\n    price: { rate: 0, period: 1s }\n";
/// let err = parse::<SupplierConfig>("etm.yaml", text, Format::Yaml).unwrap_err().to_string();
/// assert!(err.starts_with("etm.yaml: at rate_limit.data.price"), "{err}");
/// assert!(err.contains("rate"), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupplierConfig {
    /// The bucket classes.
    pub rate_limit: RateLimitClasses,
}
