//! The `pressure` configuration, as a gateway config writes it (see the
//! crate example). Limits use broker-core's shorthands or `rates` in requests
//! (a rate in tokens is refused: the layers charge requests).

use std::collections::BTreeMap;

use broker_core::{ConfigError, Limits};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod validate;

/// Resource id prefix of per-service resources: `pressure:service:<name>`.
pub const SERVICE_RESOURCE_PREFIX: &str = "pressure:service:";
/// Default resource id of the per-tenant resource.
pub const DEFAULT_TENANT_RESOURCE: &str = "pressure:tenant";

/// The `pressure` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PressureConfig {
    /// When false, the layers pass everything untouched. Defaults to true.
    pub enabled: bool,
    /// Limits per service name, for requests no `perRoute` entry matches.
    pub per_service: BTreeMap<String, Limits>,
    /// Per-route overrides; the longest matching path prefix wins.
    pub per_route: Vec<RouteConfig>,
    /// The per-tenant quota, applied after authentication.
    pub per_tenant: TenantConfig,
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
    /// The broker resource id.
    pub resource: String,
    /// A literal path prefix matched on segment boundaries, `%XX` decoded; a
    /// path that reads several ways (`%2F`, `.` segments) meets every reading.
    pub path_prefix: String,
    /// The limits. Empty limits exempt the route from the service limit.
    pub limits: Limits,
}

/// The `perTenant` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "RawTenantConfig")]
pub struct TenantConfig {
    /// Whether the tenant stage limits anything (default: whether `limits` sets one).
    pub enabled: bool,
    /// The limits every tenant gets, each tenant its own state.
    pub limits: Limits,
    /// The broker resource id whose sub-keys are the tenants.
    pub resource: String,
    /// Debugging only: plain ids (1-64 bytes of `[A-Za-z0-9._@+-]`) reach keys
    /// and logs in clear.
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
    /// Parses and validates the `pressure` object, or a whole document
    /// holding one (as [`PressureConfig::from_document`] finds it).
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
            return Self::from_tree(source_name, text, &doc);
        }
        let config: Self =
            broker_core::config::parse(source_name, text, broker_core::config::Format::Json)?;
        config.validate_at(source_name, "")?;
        Ok(config)
    }

    /// Parses a document and validates its one `pressure` object, at the top
    /// level or one down (`gateway.pressure`); errors name the full path.
    ///
    /// ```
    /// use broker_axum::PressureConfig;
    /// let doc = r#"{"gateway": {"pressure": {"perTenant": {"enabled": true, "limits": {"requestsPerMinute": -1}}}}}"#;
    /// let e = PressureConfig::from_document("kb.config.json", doc).unwrap_err();
    /// assert!(e.to_string().contains("gateway.pressure.perTenant.limits.requestsPerMinute"), "{e}");
    /// ```
    pub fn from_document(source_name: &str, text: &str) -> Result<Self, ConfigError> {
        let doc = broker_core::config::tree(source_name, text)?;
        Self::from_tree(source_name, text, &doc)
    }

    fn from_tree(source_name: &str, text: &str, doc: &Value) -> Result<Self, ConfigError> {
        let fail = |message: String| ConfigError::Parse {
            source_name: source_name.to_owned(),
            message,
        };
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
        let config: Self = broker_core::config::from_value(value).map_err(|e| {
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

/// Whether `doc` is a document holding a `pressure` object, not the object.
fn is_document(doc: &Value) -> bool {
    (doc.as_object()).is_some_and(|root| root.keys().any(|k| !FIELDS.contains(&k.as_str())))
        && !matches!(find_pressure(doc), Ok(None))
}

/// The `pressure` object of `doc` with its path (top level or one down); two
/// are an error naming both.
fn find_pressure(doc: &Value) -> Result<Option<(String, &Value)>, (String, String)> {
    let Value::Object(root) = doc else {
        return Ok(None);
    };
    let mut found = root.iter().filter_map(|(k, v)| match v {
        v if k == "pressure" => Some((k.clone(), v)),
        Value::Object(o) => {
            (o.get("pressure").filter(|p| p.is_object())).map(|p| (format!("{k}.pressure"), p))
        }
        _ => None,
    });
    match (found.next(), found.next()) {
        (Some((a, _)), Some((b, _))) => Err((a, b)),
        (one, _) => Ok(one),
    }
}

#[cfg(test)]
mod tests;
