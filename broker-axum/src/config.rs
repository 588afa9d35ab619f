//! The `pressure` configuration, as a gateway config writes it (see the
//! crate example). Limits use broker-core's shorthands or `rates` in requests
//! (a rate in tokens is refused: the layers charge requests).

use std::collections::{BTreeMap, HashSet};

use broker_core::{ConfigError, Limits, Unit};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct RawTenantConfig {
    enabled: Option<bool>,
    limits: Limits,
    resource: String,
    clear_ids: bool,
}

impl Default for RawTenantConfig {
    fn default() -> Self {
        Self {
            enabled: None,
            limits: Limits::default(),
            resource: DEFAULT_TENANT_RESOURCE.to_owned(),
            clear_ids: false,
        }
    }
}

impl From<RawTenantConfig> for TenantConfig {
    fn from(raw: RawTenantConfig) -> Self {
        Self {
            enabled: (raw.enabled).unwrap_or(raw.limits != Limits::default()),
            limits: raw.limits,
            resource: raw.resource,
            clear_ids: raw.clear_ids,
        }
    }
}

impl Default for TenantConfig {
    fn default() -> Self {
        RawTenantConfig::default().into()
    }
}

/// The resource id of the per-service resource of `service`.
pub(crate) fn service_resource(service: &str) -> String {
    format!("pressure:service:{service}")
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
            return Self::from_document(source_name, text);
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
        let fail = |message: String| ConfigError::Parse {
            source_name: source_name.to_owned(),
            message,
        };
        broker_core::config::refuse_repeated_keys(source_name, text)?;
        let (prefix, value) = find_pressure(&doc).map_err(fail)?.ok_or_else(|| {
            fail("no `pressure` object at the top level or one level down".into())
        })?;
        let config: Self = broker_core::config::from_value(value).map_err(|e| {
            let at = match e.path().to_string() {
                path if path.is_empty() || path == "." => prefix.clone(),
                path => format!("{prefix}.{path}"),
            };
            fail(format!("at {at}: {}", e.inner()))
        })?;
        config.validate_at(source_name, &prefix)?;
        Ok(config)
    }

    /// Checks what serde cannot: path prefixes, resource ids, duplicates, an
    /// enabled tenant stage without limits.
    pub(crate) fn validate_at(&self, source_name: &str, prefix: &str) -> Result<(), ConfigError> {
        let bad = |field: String, reason: &str| ConfigError::Invalid {
            field: match prefix {
                "" => format!("{source_name}: {field}"),
                _ => format!("{source_name}: {prefix}.{field}"),
            },
            reason: reason.to_owned(),
        };
        let mut ids = HashSet::new();
        for (name, limits) in &self.per_service {
            if name.is_empty() {
                return Err(bad("perService".into(), "a service name is empty"));
            }
            let id = service_resource(name);
            let checked = check_id(&id).and(check_requests(limits));
            checked.map_err(|r| bad(format!("perService.{name}"), r))?;
            ids.insert(id);
        }
        let mut prefixes = HashSet::new();
        for (i, route) in self.per_route.iter().enumerate() {
            let field = format!("perRoute[{i}]");
            check_id(&route.resource).map_err(|r| bad(format!("{field}.resource"), r))?;
            check_requests(&route.limits).map_err(|r| bad(format!("{field}.limits"), r))?;
            let twice = "used twice (each route and service needs its own resource id)";
            ensure(ids.insert(route.resource.clone()), twice)
                .map_err(|r| bad(format!("{field}.resource"), r))?;
            let prefix_field = || format!("{field}.pathPrefix");
            check_prefix(&route.path_prefix).map_err(|r| bad(prefix_field(), &r))?;
            // Compared as paths are (see `policy::normal_path`).
            let form = crate::policy::normal_path(&route.path_prefix).into_owned();
            let never = "used twice (the second route would never match)";
            ensure(prefixes.insert(form), never).map_err(|r| bad(prefix_field(), r))?;
        }
        let tenant = &self.per_tenant;
        if tenant.enabled {
            let id = || "perTenant.resource".to_owned();
            let limits = || "perTenant.limits".to_owned();
            check_id(&tenant.resource).map_err(|r| bad(id(), r))?;
            let shared = "is also a route or service resource";
            ensure(!ids.contains(&tenant.resource), shared).map_err(|r| bad(id(), r))?;
            check_requests(&tenant.limits).map_err(|r| bad(limits(), r))?;
            let none = "the tenant stage is enabled but sets no limit";
            ensure(tenant.limits != Limits::default(), none).map_err(|r| bad(limits(), r))?;
        }
        Ok(())
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
fn find_pressure(doc: &Value) -> Result<Option<(String, &Value)>, String> {
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
        (Some((a, _)), Some((b, _))) => Err(format!(
            "two `pressure` objects, at {a} and at {b}: keep one, or pass the one meant to \
             PressureConfig::from_json"
        )),
        (one, _) => Ok(one),
    }
}

/// The layers charge requests, never tokens: a token rate would limit nothing.
fn check_requests(limits: &Limits) -> Result<(), &'static str> {
    ensure(
        limits.rates.iter().all(|r| r.unit != Unit::Tokens),
        "a rate in tokens (`tokensPerMinute`) limits nothing here: the layers charge one \
         request per request and no tokens; use a rate in requests",
    )
}

/// Why `prefix` cannot be a route's path prefix, if it cannot.
fn check_prefix(prefix: &str) -> Result<(), String> {
    if !prefix.starts_with('/') {
        return Err("must start with `/`".into());
    }
    // Matched against the path alone, which holds neither.
    if prefix.contains(['?', '#']) {
        return Err("is matched against the path: it cannot hold `?` or `#`".into());
    }
    if (prefix.bytes()).any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
        return Err(
            "holds a character a request's path never holds (a space or a control \
                    character): write it percent-encoded, as requests send it"
                .into(),
        );
    }
    // A route template's parameter (`{id}`, `:id`, `*rest`) never matches literally.
    let template = |s: &&str| {
        s.starts_with(':') && s.len() > 1
            || s.starts_with('*')
            || s.contains('{') && s.contains('}')
    };
    match prefix.split('/').find(template) {
        Some(segment) => Err(format!(
            "holds `{segment}`, a route template's parameter: a prefix is \
             matched literally, segment by segment; write the part before the \
             parameter (a segment meant literally: percent-encode its first \
             character, e.g. `%3A`)"
        )),
        None => Ok(()),
    }
}

fn check_id(id: &str) -> Result<(), &'static str> {
    ensure(
        (1..=256).contains(&id.len()),
        "a resource id must be 1..=256 bytes",
    )
}

/// `reason` unless `ok`.
fn ensure(ok: bool, reason: &'static str) -> Result<(), &'static str> {
    ok.then_some(()).ok_or(reason)
}

#[cfg(test)]
mod tests;
