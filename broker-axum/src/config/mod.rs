//! The `pressure` configuration, exactly as a gateway config writes it:
//!
//! ```json
//! {
//!   "enabled": true,
//!   "perService": { "rest": { "requestsPerSecond": 50 } },
//!   "perRoute": [{
//!     "resource": "gateway:route:webhooks-github",
//!     "pathPrefix": "/api/v1/webhooks/github",
//!     "limits": { "requestsPerSecond": 100, "maxConcurrentRequests": 200 }
//!   }],
//!   "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 6000 } }
//! }
//! ```
//!
//! Limits use broker-core's shorthands (`requestsPerSecond`,
//! `requestsPerMinute`, `maxConcurrentRequests`) or explicit `rates` in
//! requests; a rate in tokens (`tokensPerMinute`) is refused, as the
//! layers charge one request per request and no tokens. Every error names
//! the field it is about, e.g.
//! `gateway.pressure.perRoute[0].limits: requestsPerSecond: must be greater
//! than zero (got 0)`.

use std::collections::BTreeMap;

use broker_core::{ConfigError, Limits};
use serde::{Deserialize, Serialize};

mod validate;

/// Resource id prefix of per-service resources: `pressure:service:<name>`.
pub const SERVICE_RESOURCE_PREFIX: &str = "pressure:service:";
/// Default resource id of the per-tenant resource (its states are keyed by
/// tenant).
pub const DEFAULT_TENANT_RESOURCE: &str = "pressure:tenant";

/// The `pressure` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PressureConfig {
    /// When false, the layers pass every request through untouched (and call
    /// no broker). Defaults to true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Limits per service name. A layer applies one service's limits to
    /// every request that no `perRoute` entry matches.
    #[serde(default)]
    pub per_service: BTreeMap<String, Limits>,
    /// Per-route overrides, matched by path prefix; the longest matching
    /// prefix wins and replaces the service limit for that request.
    #[serde(default)]
    pub per_route: Vec<RouteConfig>,
    /// The per-tenant quota, applied after authentication.
    #[serde(default)]
    pub per_tenant: TenantConfig,
}

fn yes() -> bool {
    true
}

fn default_tenant_resource() -> String {
    DEFAULT_TENANT_RESOURCE.to_owned()
}

impl Default for PressureConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            per_service: BTreeMap::new(),
            per_route: Vec::new(),
            per_tenant: TenantConfig::default(),
        }
    }
}

/// One `perRoute` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteConfig {
    /// The broker resource id (shared with anything else that uses it,
    /// e.g. `enqueue` calls on the same id).
    pub resource: String,
    /// Requests whose path is this prefix, or continues it after a `/`,
    /// match (`/api/webhooks` matches `/api/webhooks` and
    /// `/api/webhooks/stripe`, not `/api/webhooksx`). Must start with `/`
    /// and hold no `?`, `#`, space or control character. Both are compared
    /// with every `%XX` but `%2F` decoded, as a router decodes path
    /// parameters: a prefix `/hooks/stripe` limits `/hooks/%73tripe` too,
    /// and `/hooks/café` (written raw or as `/hooks/caf%C3%A9`) limits both
    /// spellings of it. `%2F` is a `/` inside a segment, not a boundary,
    /// as the router reads it; as a wildcard route's handler gets it, it
    /// is a `/`, and a request meets the limits of both readings (a prefix
    /// `/files/a%2Fb` limits `/files/a/b/x` too). So does a path with a `.`
    /// or empty segment, which such a handler reading its path as a file
    /// path skips: `/files/./private/x` and `/files//private/x` meet the
    /// limit of a prefix `/files/private` too. A prefix is literal: one
    /// with a route template's parameter as a segment (`:id`, `*rest`,
    /// `{id}`) is refused.
    pub path_prefix: String,
    /// The limits. Empty limits exempt the route from the service limit.
    pub limits: Limits,
}

/// The `perTenant` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "RawTenantConfig")]
pub struct TenantConfig {
    /// Whether the tenant stage limits anything. Left out, it is true when
    /// `limits` sets a limit: a limit written down is applied.
    pub enabled: bool,
    /// The limits every tenant gets, each tenant its own state.
    pub limits: Limits,
    /// The broker resource id whose sub-keys are the tenants.
    pub resource: String,
    /// For debugging only: a tenant id of 1 to 64 bytes of
    /// `[A-Za-z0-9._@+-]` reaches keys and logs in clear, not as its
    /// fingerprint. Never set it where ids are secrets (API keys).
    pub clear_ids: bool,
}

/// [`TenantConfig`] as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTenantConfig {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    limits: Limits,
    #[serde(default = "default_tenant_resource")]
    resource: String,
    #[serde(default)]
    clear_ids: bool,
}

impl From<RawTenantConfig> for TenantConfig {
    fn from(raw: RawTenantConfig) -> Self {
        let sets_a_limit = !raw.limits.rates.is_empty() || raw.limits.max_concurrent.is_some();
        Self {
            enabled: raw.enabled.unwrap_or(sets_a_limit),
            limits: raw.limits,
            resource: raw.resource,
            clear_ids: raw.clear_ids,
        }
    }
}

impl Default for TenantConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            limits: Limits::default(),
            resource: default_tenant_resource(),
            clear_ids: false,
        }
    }
}

/// The resource id of the per-service resource of `service`.
pub fn service_resource(service: &str) -> String {
    format!("{SERVICE_RESOURCE_PREFIX}{service}")
}

impl PressureConfig {
    /// Parses the `pressure` object itself, or a whole config document
    /// holding one (as [`PressureConfig::from_document`] finds it), named
    /// `source_name` in errors, and validates it. A top-level object with a
    /// key the `pressure` object has not, and a `pressure` object at the
    /// top level or one level down, is such a document.
    ///
    /// ```
    /// use broker_axum::PressureConfig;
    /// let c = PressureConfig::from_json("inline", r#"{"perService": {"rest": {"requestsPerSecond": 50}}}"#).unwrap();
    /// assert!(c.enabled);
    /// let e = PressureConfig::from_json("inline", r#"{"perRoute": [{"resource": "r", "pathPrefix": "/a", "limits": {"requestsPerSecond": 0}}]}"#)
    ///     .unwrap_err();
    /// assert!(e.to_string().contains("perRoute[0].limits"), "{e}");
    /// ```
    pub fn from_json(source_name: &str, text: &str) -> Result<Self, ConfigError> {
        let doc = broker_core::config::tree(source_name, text)?;
        if is_document(&doc) {
            return Self::from_tree(source_name, text, doc);
        }
        let config: Self =
            broker_core::config::parse(source_name, text, broker_core::config::Format::Json)?;
        config.validate_at(source_name, "")?;
        Ok(config)
    }

    /// Parses a whole config document and takes its `pressure` object, found
    /// at the top level or one level down (e.g. `gateway.pressure`), then
    /// validates it. Errors name the full path. Two `pressure` objects (say
    /// `staging.pressure` and `gateway.pressure`) are an error naming both.
    /// A key written twice anywhere in the document is refused: the
    /// document's tree would keep only the last of them.
    ///
    /// ```
    /// use broker_axum::PressureConfig;
    /// let doc = r#"{"gateway": {"pressure": {"perTenant": {"enabled": true, "limits": {"requestsPerMinute": -1}}}}}"#;
    /// let e = PressureConfig::from_document("kb.config.json", doc).unwrap_err();
    /// assert!(e.to_string().contains("gateway.pressure.perTenant.limits.requestsPerMinute"), "{e}");
    /// ```
    pub fn from_document(source_name: &str, text: &str) -> Result<Self, ConfigError> {
        let doc = broker_core::config::tree(source_name, text)?;
        Self::from_tree(source_name, text, doc)
    }

    /// [`PressureConfig::from_document`] of `text`, already parsed into `doc`.
    fn from_tree(
        source_name: &str,
        text: &str,
        doc: serde_json::Value,
    ) -> Result<Self, ConfigError> {
        let fail = |message: String| ConfigError::Parse {
            source_name: source_name.to_owned(),
            message,
        };
        // The tree keeps one value per key: a service named twice is
        // refused from the text.
        broker_core::config::refuse_repeated_keys(source_name, text)?;
        let (prefix, value) = find_pressure(doc)
            .map_err(|(a, b)| {
                fail(format!(
                    "two `pressure` objects, at {a} and at {b}: keep one, or pass the one \
                     meant to PressureConfig::from_json"
                ))
            })?
            .ok_or_else(|| {
                fail("no `pressure` object at the top level or one level down".into())
            })?;
        let config: Self = broker_core::config::from_value(&value).map_err(|e| {
            let path = e.path().to_string();
            let at = if path.is_empty() || path == "." {
                prefix.clone()
            } else {
                format!("{prefix}.{path}")
            };
            fail(format!("at {at}: {}", e.inner()))
        })?;
        config.validate_at(source_name, &prefix)?;
        Ok(config)
    }
}

/// The fields of the `pressure` object.
const FIELDS: [&str; 4] = ["enabled", "perService", "perRoute", "perTenant"];

/// Whether `text` is a whole document holding a `pressure` object (or two)
/// rather than the object itself: its top level has a key the object has
/// not, and [`find_pressure`] finds one.
fn is_document(doc: &serde_json::Value) -> bool {
    match doc {
        serde_json::Value::Object(root) => {
            root.keys().any(|k| !FIELDS.contains(&k.as_str()))
                && !matches!(find_pressure(doc.clone()), Ok(None))
        }
        _ => false,
    }
}

/// The `pressure` object of `doc`, with its path: the value of a top-level
/// `pressure` key, or an object under a `pressure` key one level down (a
/// `pressure` number there, say a boiler's, is not one). More than one is
/// an error naming two of them (keys in order): picking one would apply a
/// config the reader may not have meant.
fn find_pressure(
    doc: serde_json::Value,
) -> Result<Option<(String, serde_json::Value)>, (String, String)> {
    let serde_json::Value::Object(root) = doc else {
        return Ok(None);
    };
    let mut found = Vec::new();
    for (k, v) in root {
        match v {
            v if k == "pressure" => found.push((k, v)),
            serde_json::Value::Object(mut o) => {
                if let Some(p @ serde_json::Value::Object(_)) = o.remove("pressure") {
                    found.push((format!("{k}.pressure"), p));
                }
            }
            _ => {}
        }
    }
    let mut found = found.into_iter();
    match (found.next(), found.next()) {
        (Some((a, _)), Some((b, _))) => Err((a, b)),
        (one, _) => Ok(one),
    }
}

#[cfg(test)]
mod tests;
