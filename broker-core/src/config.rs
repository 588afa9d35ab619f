//! Configuration shapes and loading: limits with the shorthands of the
//! `pressure` config (`requestsPerSecond`, `requestsPerMinute`,
//! `tokensPerMinute`, `maxConcurrentRequests`) or explicit `rates`, and
//! per-resource settings. JSON, YAML and TOML load into the same types;
//! errors name the source, the path inside it and what is wrong.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::limits::{Limits, RateLimit, Unit};

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

/// A limit that is written: `null` would load as no limit, so is refused.
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
        let shorthands = [
            (
                "requestsPerSecond",
                c.requests_per_second,
                1,
                Unit::Requests,
            ),
            (
                "requestsPerMinute",
                c.requests_per_minute,
                60,
                Unit::Requests,
            ),
            ("tokensPerMinute", c.tokens_per_minute, 60, Unit::Tokens),
        ];
        // The explicit rates first, by the indices their author wrote.
        for (i, rate) in c.rates.iter().enumerate() {
            rate.validate(&format!("rates[{i}]"))?;
        }
        for (field, amount, secs, unit) in shorthands {
            let Some(amount) = amount else { continue };
            let rate = RateLimit::per(amount, Duration::from_secs(secs)).unit(unit);
            // The shorthand's own name, with the reason the rate's check gave.
            rate.validate(field).map_err(|e| match e {
                ConfigError::NotPositive { .. } => ConfigError::NotPositive {
                    field: field.into(),
                    value: amount.to_string(),
                },
                ConfigError::Invalid { reason, .. } => ConfigError::Invalid {
                    field: field.into(),
                    reason,
                },
                other => other,
            })?;
            rates.push(rate);
        }
        if c.max_concurrent_requests == Some(0) {
            return Err(ConfigError::NotPositive {
                field: "maxConcurrentRequests".into(),
                value: "0".into(),
            });
        }
        rates.extend(c.rates);
        let limits = Limits {
            rates,
            max_concurrent: c.max_concurrent_requests,
        };
        limits.validate()?;
        Ok(limits)
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
    /// [`crate::Backend::leases_end_with_holders`]).
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// On a store shared by processes (Redis), a permit's lease is renewed
    /// for at most this long (1 h by default), then expires within
    /// `lease_ttl`: so a permit never released (`std::mem::forget`) frees it.
    #[serde(default = "default_max_hold", with = "humantime_serde")]
    pub max_hold: Duration,
    /// How `enqueue` retries.
    #[serde(default)]
    pub retry: crate::retry::RetryPolicy,
    /// Spend this fraction under every rate (0 to 0.5, default 0): absorbs
    /// the drift between our send time and the upstream's receive time
    /// (see [`crate::pacing`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pacing_margin: f64,
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
    retry: crate::retry::RetryPolicy,
    #[serde(default)]
    pacing_margin: f64,
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
        }
    }

    /// Sets the pacing margin (see [`crate::pacing`]).
    pub fn pacing_margin(mut self, margin: f64) -> Self {
        self.pacing_margin = margin;
        self
    }

    /// The limits the buckets enforce: [`ResourceConfig::limits`] paced
    /// [`ResourceConfig::pacing_margin`] under.
    pub fn paced_limits(&self) -> Limits {
        crate::pacing::paced(&self.limits, self.pacing_margin)
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
    pub fn retry(mut self, retry: crate::retry::RetryPolicy) -> Self {
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
        if crate::clock::micros(self.lease_ttl) == 0 {
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
        crate::pacing::validate(self.pacing_margin)?;
        self.retry.validate()
    }
}

/// The document formats [`parse`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
    /// TOML.
    Toml,
}

impl Format {
    /// The format implied by a file name's extension (JSON otherwise).
    pub fn from_path(path: &str) -> Self {
        if path.ends_with(".yaml") || path.ends_with(".yml") {
            Format::Yaml
        } else if path.ends_with(".toml") {
            Format::Toml
        } else {
            Format::Json
        }
    }
}

/// Parses `text` (named `source_name` in errors) into `T`. Errors carry the
/// path inside the document, e.g. `pressure.perRoute[1].limits.requestsPerSecond`.
///
/// ```
/// use broker_core::config::{parse, Format};
/// use broker_core::Limits;
/// let err = parse::<Limits>("limits.json", r#"{"rates":[{"amount":5,"period":"1s","burst":0}]}"#, Format::Json)
///     .unwrap_err();
/// assert!(err.to_string().starts_with("limits.json: "), "{err}");
/// assert!(err.to_string().contains("burst"), "{err}");
/// ```
pub fn parse<T: DeserializeOwned>(
    source_name: &str,
    text: &str,
    format: Format,
) -> Result<T, ConfigError> {
    let fail = |message: String| ConfigError::Parse {
        source_name: source_name.to_owned(),
        message,
    };
    let parsed = match format {
        Format::Json => {
            let de = &mut serde_json::Deserializer::from_str(text);
            let parsed = serde_path_to_error::deserialize(&mut *de)
                .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())));
            // Text after the value (an object closed early, say) would be
            // left unread, and what it holds dropped without a word.
            parsed.and_then(|v| de.end().map(|()| v).map_err(|e| fail(e.to_string())))
        }
        Format::Yaml => {
            let de = serde_norway::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de)
                .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())))
        }
        Format::Toml => {
            let de = toml::Deserializer::new(text);
            serde_path_to_error::deserialize(de)
                .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())))
        }
    };
    // Read as written, a JSON or TOML document may still hold a settings
    // object written as a list, which serde takes field by field in
    // declaration order: read again from its tree with structs from
    // objects only, and refused if a list stands for one. Only that refusal
    // counts: the tree reads some things otherwise (a map's number keys,
    // say), which the first reading has settled (a refusal of a list is
    // the error even when the first reading failed: it took the list's
    // items for fields). YAML's reader refuses a list for a struct itself,
    // and its tree would turn unquoted scalars into numbers; a document
    // without a JSON tree keeps the first reading.
    let tree: Option<serde_json::Value> = match format {
        Format::Json => serde_json::from_str(text).ok(),
        Format::Toml => toml::from_str(text).ok(),
        Format::Yaml => None,
    };
    if let Some(Err(e)) = tree.map(|tree| from_value::<T>(&tree)) {
        if crate::named_fields::refuses_a_list(e.inner()) {
            return Err(fail(located(e.path().to_string(), e.inner().to_string())));
        }
    }
    let parsed = parsed?;
    match format {
        Format::Json => refuse_repeated_keys(source_name, text)?,
        Format::Yaml => {
            // YAML's messages name the path themselves. Only a repeated
            // key counts: the check stops at a key that is no scalar (a
            // list or a mapping), which the typed reading has settled.
            let de = serde_norway::Deserializer::from_str(text);
            if let Err(e) = crate::unique_keys::UniqueKeys::deserialize(de) {
                let message = e.to_string();
                if crate::unique_keys::refuses_a_repeated_key(&message) {
                    return Err(fail(message));
                }
            }
        }
        // TOML's reader refuses a repeated key itself.
        Format::Toml => {}
    }
    Ok(parsed)
}

/// Refuses a JSON document with an object whose key is written twice, at
/// that object's path: a JSON reader keeps the last value, so a map of
/// names (resources, services) would take the second entry without a
/// word. [`parse`] checks JSON documents with it (and YAML ones the same
/// way; TOML's reader refuses a repeated key itself); call it on a JSON
/// document that is read into a tree first (a tree keeps one value per
/// key).
///
/// ```
/// use broker_core::config::refuse_repeated_keys;
/// assert!(refuse_repeated_keys("ok.json", r#"{"a": {"x": 1}, "b": {"x": 1}}"#).is_ok());
/// let e = refuse_repeated_keys("twice.json", r#"{"services": {"rest": 1, "rest": 2}}"#)
///     .unwrap_err();
/// assert!(e.to_string().contains("at services: the key `rest` is written twice"), "{e}");
/// ```
pub fn refuse_repeated_keys(source_name: &str, text: &str) -> Result<(), ConfigError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, crate::unique_keys::UniqueKeys>(de)
        .map(|_| ())
        .map_err(|e| ConfigError::Parse {
            source_name: source_name.to_owned(),
            message: located(e.path().to_string(), e.inner().to_string()),
        })
}

/// An error's message with the path it is at, if any.
fn located(path: String, inner: String) -> String {
    if path.is_empty() || path == "." {
        inner
    } else {
        format!("at {path}: {inner}")
    }
}

/// Parses a JSON document (named `source_name` in errors) into a tree. An
/// error names its path inside the document, e.g. a number out of range.
///
/// ```
/// let e = broker_core::config::tree("kb.json", r#"{"a": [{"b": 1e400}]}"#).unwrap_err();
/// assert!(e.to_string().starts_with("kb.json: at a[0].b: number out of range"), "{e}");
/// ```
pub fn tree(source_name: &str, text: &str) -> Result<serde_json::Value, ConfigError> {
    let fail = |message: String| ConfigError::Parse {
        source_name: source_name.to_owned(),
        message,
    };
    let de = &mut serde_json::Deserializer::from_str(text);
    let tree = serde_path_to_error::deserialize(&mut *de)
        .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())))?;
    de.end().map_err(|e| fail(e.to_string()))?;
    Ok(tree)
}

/// Reads `T` from a document already parsed into a JSON tree, every
/// struct from an object only (a list where a struct stands is an error at
/// its path, where serde's derived structs would read the list's items as
/// the fields in order). The error carries the path inside the tree.
///
/// ```
/// use broker_core::config::from_value;
/// use broker_core::RateLimit;
/// let tree = serde_json::json!({"amount": 5, "period": "1s"});
/// assert_eq!(from_value::<RateLimit>(&tree).unwrap(), RateLimit::per_second(5));
/// let listed = serde_json::json!([[5, "1s"]]);
/// let e = from_value::<Vec<RateLimit>>(&listed).unwrap_err();
/// assert_eq!(e.path().to_string(), "[0]");
/// assert!(e.inner().to_string().contains("an object with named fields"));
/// ```
pub fn from_value<T: DeserializeOwned>(
    tree: &serde_json::Value,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(crate::named_fields::NamedFields(tree))
}

/// Reads and parses a config file; the format comes from its extension.
pub fn load<T: DeserializeOwned>(path: &std::path::Path) -> Result<T, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Parse {
        source_name: name.clone(),
        message: e.to_string(),
    })?;
    parse(&name, &text, Format::from_path(&name))
}
