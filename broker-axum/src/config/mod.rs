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

use std::collections::{BTreeMap, HashSet};

use broker_core::{ConfigError, Limits, Unit};
use serde::{Deserialize, Serialize};

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

    /// Checks what serde cannot: path prefixes, resource ids, duplicates,
    /// an enabled tenant stage without limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("<config>", "")
    }

    fn validate_at(&self, source_name: &str, prefix: &str) -> Result<(), ConfigError> {
        let at = |field: String| {
            if prefix.is_empty() {
                field
            } else {
                format!("{prefix}.{field}")
            }
        };
        let bad = |field: String, reason: &str| ConfigError::Invalid {
            field: format!("{source_name}: {}", at(field)),
            reason: reason.to_owned(),
        };
        let mut ids = HashSet::new();
        for (name, limits) in &self.per_service {
            if name.is_empty() {
                return Err(bad("perService".into(), "a service name is empty"));
            }
            let id = service_resource(name);
            check_id(&id).map_err(|r| bad(format!("perService.{name}"), r))?;
            check_requests(limits).map_err(|r| bad(format!("perService.{name}"), r))?;
            ids.insert(id);
        }
        let mut prefixes = HashSet::new();
        for (i, route) in self.per_route.iter().enumerate() {
            let field = format!("perRoute[{i}]");
            check_id(&route.resource).map_err(|r| bad(format!("{field}.resource"), r))?;
            check_requests(&route.limits).map_err(|r| bad(format!("{field}.limits"), r))?;
            if !ids.insert(route.resource.clone()) {
                return Err(bad(
                    format!("{field}.resource"),
                    "used twice (each route and service needs its own resource id)",
                ));
            }
            if !route.path_prefix.starts_with('/') {
                return Err(bad(format!("{field}.pathPrefix"), "must start with `/`"));
            }
            // Matched against the path alone, which holds neither.
            if route.path_prefix.contains(['?', '#']) {
                return Err(bad(
                    format!("{field}.pathPrefix"),
                    "is matched against the path: it cannot hold `?` or `#`",
                ));
            }
            if route
                .path_prefix
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                return Err(bad(
                    format!("{field}.pathPrefix"),
                    "holds a character a request's path never holds (a space or a control \
                     character): write it percent-encoded, as requests send it",
                ));
            }
            if let Some(segment) = template_segment(&route.path_prefix) {
                return Err(bad(
                    format!("{field}.pathPrefix"),
                    &format!(
                        "holds `{segment}`, a route template's parameter: a prefix is \
                         matched literally, segment by segment; write the part before the \
                         parameter (a segment meant literally: percent-encode its first \
                         character, e.g. `%3A`)"
                    ),
                ));
            }
            // Compared as paths are (see `policy::normal_path`).
            if !prefixes.insert(crate::policy::normal_path(&route.path_prefix).into_owned()) {
                return Err(bad(
                    format!("{field}.pathPrefix"),
                    "used twice (the second route would never match)",
                ));
            }
        }
        let tenant = &self.per_tenant;
        if tenant.enabled {
            check_id(&tenant.resource).map_err(|r| bad("perTenant.resource".into(), r))?;
            if ids.contains(&tenant.resource) {
                return Err(bad(
                    "perTenant.resource".into(),
                    "is also a route or service resource",
                ));
            }
            check_requests(&tenant.limits).map_err(|r| bad("perTenant.limits".into(), r))?;
            if tenant.limits.rates.is_empty() && tenant.limits.max_concurrent.is_none() {
                return Err(bad(
                    "perTenant.limits".into(),
                    "the tenant stage is enabled but sets no limit",
                ));
            }
        }
        Ok(())
    }
}

/// The layers charge one request per request and no tokens: a rate in
/// tokens would never be charged, so would limit nothing.
fn check_requests(limits: &Limits) -> Result<(), &'static str> {
    match limits.rates.iter().any(|r| r.unit == Unit::Tokens) {
        true => Err(
            "a rate in tokens (`tokensPerMinute`) limits nothing here: the layers \
                     charge one request per request and no tokens; use a rate in requests",
        ),
        false => Ok(()),
    }
}

/// The first segment of `prefix` that reads as a route template's
/// parameter (`{id}`, `{*rest}`, `:id`, `*rest`, `*`), which a prefix,
/// matched literally, would only ever meet in a path that sends it as it
/// is written.
fn template_segment(prefix: &str) -> Option<&str> {
    prefix.split('/').find(|s| {
        s.starts_with(':') && s.len() > 1
            || s.starts_with('*')
            || (s.contains('{') && s.contains('}'))
    })
}

fn check_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() || id.len() > 256 {
        Err("a resource id must be 1..=256 bytes")
    } else {
        Ok(())
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
mod tests {
    use super::*;
    use broker_core::RateLimit;

    #[test]
    fn routes_and_stages_written_as_lists_are_refused_with_their_path() {
        for (text, needle) in [
            (
                r#"{"perRoute": [["r", "/a", {"requestsPerSecond": 5}]]}"#,
                "perRoute[0]",
            ),
            (
                r#"{"perTenant": [true, {"requestsPerMinute": 60}]}"#,
                "perTenant",
            ),
            (r#"[true, {}]"#, "inline"),
        ] {
            let e = PressureConfig::from_json("inline", text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{text}: {e:?} should name {needle}");
            assert!(e.contains("an object with named fields"), "{text}: {e:?}");
        }
        let doc = r#"{"pressure": {"perRoute": [["r", "/a", {"requestsPerSecond": 5}]]}}"#;
        let e = PressureConfig::from_document("kb.json", doc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pressure.perRoute[0]"), "{e:?}");
        assert!(e.contains("an object with named fields"), "{e:?}");
    }

    /// A JSON reader keeps the last of two keys: a service named twice is
    /// refused at its object, from `from_json` and from `from_document`.
    #[test]
    fn a_service_named_twice_is_refused_with_its_path() {
        let twice = r#"{"perService": {"rest": {"requestsPerSecond": 5}, "rest": {"requestsPerSecond": 500}}}"#;
        let e = PressureConfig::from_json("p.json", twice)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("at perService: the key `rest` is written twice"),
            "{e}"
        );
        let doc = format!(r#"{{"gateway": {{"pressure": {twice}}}}}"#);
        let e = PressureConfig::from_document("kb.json", &doc)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("at gateway.pressure.perService: the key `rest` is written twice"),
            "{e}"
        );
    }

    const SEED: &str = r#"{
      "gateway": {
        "pressure": {
          "enabled": true,
          "perService": { "rest": { "requestsPerSecond": 50 } },
          "perRoute": [{
            "resource": "gateway:route:webhooks-github",
            "pathPrefix": "/api/v1/webhooks/github",
            "limits": { "requestsPerSecond": 100, "maxConcurrentRequests": 200 }
          }],
          "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 6000 } }
        }
      }
    }"#;

    #[test]
    fn seed_document_parses_to_its_limits() {
        let c = PressureConfig::from_document("kb.config.json", SEED).unwrap();
        assert!(c.enabled);
        assert_eq!(c.per_service["rest"].rates[0].amount, 50);
        let route = &c.per_route[0];
        assert_eq!(route.resource, "gateway:route:webhooks-github");
        assert_eq!(route.path_prefix, "/api/v1/webhooks/github");
        assert_eq!(route.limits.rates[0].amount, 100);
        assert_eq!(route.limits.max_concurrent, Some(200));
        assert!(c.per_tenant.enabled);
        assert_eq!(
            c.per_tenant.limits.rates[0].period,
            std::time::Duration::from_secs(60)
        );
        assert_eq!(c.per_tenant.resource, DEFAULT_TENANT_RESOURCE);
    }

    #[test]
    fn zero_limit_error_names_the_full_path() {
        let doc = SEED.replace("\"requestsPerSecond\": 100", "\"requestsPerSecond\": 0");
        let e = PressureConfig::from_document("kb.config.json", &doc)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("kb.config.json: "), "{e}");
        assert!(e.contains("gateway.pressure.perRoute[0].limits"), "{e}");
        assert!(e.contains("requestsPerSecond"), "{e}");
    }

    #[test]
    fn unknown_field_is_rejected_with_its_path() {
        let doc = SEED.replace("\"pathPrefix\"", "\"pathprefix\"");
        let e = PressureConfig::from_document("x.json", &doc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway.pressure.perRoute[0]"), "{e}");
        assert!(e.contains("pathprefix"), "{e}");
    }

    #[test]
    fn path_prefix_without_slash_is_rejected() {
        let doc = SEED.replace("\"/api/v1/webhooks/github\"", "\"api\"");
        let e = PressureConfig::from_document("x.json", &doc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway.pressure.perRoute[0].pathPrefix"), "{e}");
    }

    /// A rate in tokens would never be charged by the layers (one request,
    /// no tokens, per request): refused where it stands, at each level.
    #[test]
    fn a_rate_in_tokens_is_rejected_with_its_path() {
        for (text, path) in [
            (
                r#"{"perService": {"rest": {"tokensPerMinute": 2}}}"#,
                "perService.rest",
            ),
            (
                r#"{"perRoute": [{"resource": "r", "pathPrefix": "/a",
                    "limits": {"requestsPerSecond": 5, "tokensPerMinute": 2}}]}"#,
                "perRoute[0].limits",
            ),
            (
                r#"{"perTenant": {"enabled": true, "limits": {"tokensPerMinute": 1}}}"#,
                "perTenant.limits",
            ),
        ] {
            let e = PressureConfig::from_json("p.json", text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(path), "{e}");
            assert!(e.contains("tokens"), "{e}");
        }
    }

    /// An object closed one brace early leaves the rest of the text after
    /// it: refused, not read up to there (which dropped `perRoute`).
    #[test]
    fn text_after_the_config_is_refused_not_dropped() {
        let text = r#"{"perService": {"rest": {"requestsPerSecond": 50}}},
            "perRoute": [{"resource": "r", "pathPrefix": "/a", "limits": {"requestsPerSecond": 1}}]}"#;
        let e = PressureConfig::from_json("p.json", text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.json: "), "{e}");
        assert!(e.contains("trailing characters at line 1"), "{e}");
        // Whitespace after the object is no text.
        assert!(PressureConfig::from_json("p.json", "{}\n\t ").is_ok());
    }

    #[test]
    fn enabled_tenant_stage_without_limits_is_rejected() {
        let e = PressureConfig::from_json("p.json", r#"{"perTenant": {"enabled": true}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("perTenant.limits"), "{e}");
    }

    #[test]
    fn duplicate_route_resource_is_rejected() {
        let text = r#"{"perRoute": [
            {"resource": "r", "pathPrefix": "/a", "limits": {}},
            {"resource": "r", "pathPrefix": "/b", "limits": {}}]}"#;
        let e = PressureConfig::from_json("p.json", text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("perRoute[1].resource"), "{e}");
    }

    #[test]
    fn a_slash_inside_a_segment_is_a_prefix_of_its_own() {
        let text = r#"{"perRoute": [
            {"resource": "r1", "pathPrefix": "/files/a%2Fb", "limits": {}},
            {"resource": "r2", "pathPrefix": "/files/a/b", "limits": {}},
            {"resource": "r3", "pathPrefix": "/files/caf\u00e9", "limits": {}}]}"#;
        let config = PressureConfig::from_json("p.json", text).unwrap();
        assert_eq!(config.per_route.len(), 3);
    }

    #[test]
    fn a_prefix_that_could_never_match_is_rejected() {
        for (a, b, field) in [
            ("/a", "/a", "perRoute[1].pathPrefix"),
            ("/a?x=1", "/b", "perRoute[0].pathPrefix"),
            ("/a", "/b#top", "perRoute[1].pathPrefix"),
            // Characters requests send percent-encoded.
            ("/a", "/my hooks", "perRoute[1].pathPrefix"),
            ("/a", "/b\t", "perRoute[1].pathPrefix"),
            // The same path as the first, once unreserved letters are decoded.
            ("/ab", "/a%62", "perRoute[1].pathPrefix"),
            ("/caf\u{e9}", "/caf%C3%A9", "perRoute[1].pathPrefix"),
            ("/users/%40me", "/users/@me", "perRoute[1].pathPrefix"),
            ("/a/b%2F", "/a/b%2f", "perRoute[1].pathPrefix"),
        ] {
            let text = format!(
                r#"{{"perRoute": [
                {{"resource": "r1", "pathPrefix": "{a}", "limits": {{}}}},
                {{"resource": "r2", "pathPrefix": "{b}", "limits": {{}}}}]}}"#
            );
            let e = PressureConfig::from_json("p.json", &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{a} {b}: {e}");
        }
    }

    #[test]
    fn a_prefix_written_as_a_route_template_is_rejected() {
        for (prefix, segment) in [
            ("/users/:id", ":id"),
            ("/users/{id}/orders", "{id}"),
            ("/files/{*rest}", "{*rest}"),
            ("/files/*", "*"),
            ("/files/*path", "*path"),
            ("/v1/item-{n}", "item-{n}"),
        ] {
            let text = format!(
                r#"{{"perRoute": [{{"resource": "r", "pathPrefix": "{prefix}", "limits": {{}}}}]}}"#
            );
            let e = PressureConfig::from_json("p.json", &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains("perRoute[0].pathPrefix"), "{prefix}: {e}");
            assert!(e.contains(&format!("holds `{segment}`")), "{prefix}: {e}");
        }
        // A `:` or `*` inside a segment, a lone brace, and a parameter's
        // first character percent-encoded are literal.
        for prefix in [
            "/a:b",
            "/time/12:00",
            "/x*y",
            "/a{b",
            "/users/%3Aid",
            "/%2A",
        ] {
            let text = format!(
                r#"{{"perRoute": [{{"resource": "r", "pathPrefix": "{prefix}", "limits": {{}}}}]}}"#
            );
            assert!(
                PressureConfig::from_json("p.json", &text).is_ok(),
                "{prefix}"
            );
        }
    }

    #[test]
    fn a_document_with_two_pressure_objects_is_an_error_naming_both() {
        let doc = r#"{"staging": {"pressure": {"enabled": true}},
                      "gateway": {"pressure": {"enabled": false}}}"#;
        let e = PressureConfig::from_document("x.json", doc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway.pressure"), "{e}");
        assert!(e.contains("staging.pressure"), "{e}");
        let doc = r#"{"pressure": {}, "gateway": {"pressure": {}}}"#;
        let e = PressureConfig::from_document("x.json", doc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at pressure"), "{e}");
        assert!(e.contains("gateway.pressure"), "{e}");
        // One, at either depth, is found; a `pressure` one level down that
        // is no object is something else's.
        let one = r#"{"boiler": {"pressure": 3.2}, "gateway": {"pressure": {"enabled": false}}}"#;
        assert!(
            !PressureConfig::from_document("x.json", one)
                .unwrap()
                .enabled
        );
    }

    /// The seed's own gateway file, verbatim, loads with `from_json`, the
    /// loader the README shows, into what `from_document` reads.
    #[test]
    fn the_seed_gateway_document_loads_with_from_json() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/seed-configs/kb.config.json"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let c = PressureConfig::from_json("kb.config.json", &text).unwrap();
        assert_eq!(
            c,
            PressureConfig::from_document("kb.config.json", &text).unwrap()
        );
        assert_eq!(c, PressureConfig::from_json("inline", SEED).unwrap());
        assert_eq!(
            c.per_service["rest"],
            Limits::new().rate(RateLimit::per_second(50))
        );
        assert_eq!(c.per_route[0].limits.max_concurrent, Some(200));
        assert!(c.per_tenant.enabled);
        assert_eq!(c.per_tenant.limits.rates, [RateLimit::per_minute(6000)]);
        // The object itself still reads as it did, and a field of it that
        // is misspelt is still named, not taken for a document.
        let typo = r#"{"enabled": true, "perServce": {"rest": {"requestsPerSecond": 5}}}"#;
        let e = PressureConfig::from_json("p.json", typo)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `perServce`"), "{e}");
    }

    /// `perTenant` limits written without `"enabled"` limit the tenants
    /// (they loaded as a stage turned off, limiting nothing); written
    /// with `"enabled": false`, they stay off.
    #[test]
    fn tenant_limits_written_without_enabled_are_applied() {
        let text = r#"{"perTenant": {"limits": {"requestsPerMinute": 60}}}"#;
        let c = PressureConfig::from_json("p.json", text).unwrap();
        assert!(c.per_tenant.enabled);
        assert_eq!(c.per_tenant.limits.rates, [RateLimit::per_minute(60)]);
        let doc = format!(r#"{{"gateway": {{"pressure": {text}}}}}"#);
        assert!(
            PressureConfig::from_document("kb.json", &doc)
                .unwrap()
                .per_tenant
                .enabled
        );
        let off = r#"{"perTenant": {"enabled": false, "limits": {"requestsPerMinute": 60}}}"#;
        assert!(
            !PressureConfig::from_json("p.json", off)
                .unwrap()
                .per_tenant
                .enabled
        );
        // Nothing written, nothing enabled.
        let none = r#"{"perTenant": {"resource": "tenants"}}"#;
        assert!(
            !PressureConfig::from_json("p.json", none)
                .unwrap()
                .per_tenant
                .enabled
        );
    }

    /// A limit written as `null` is refused with its path: it loaded as
    /// no limit and exempted the route.
    #[test]
    fn a_null_limit_is_refused_with_its_path() {
        for field in [
            "requestsPerSecond",
            "requestsPerMinute",
            "maxConcurrentRequests",
        ] {
            let text = format!(
                r#"{{"perRoute": [{{"resource": "r", "pathPrefix": "/a", "limits": {{"{field}": null}}}}]}}"#
            );
            let e = PressureConfig::from_json("p.json", &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("perRoute[0].limits.{field}")), "{e}");
            assert!(e.contains("null"), "{e}");
            let doc = format!(r#"{{"gateway": {{"pressure": {text}}}}}"#);
            let e = PressureConfig::from_document("kb.json", &doc)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("gateway.pressure.perRoute[0].limits.{field}")),
                "{e}"
            );
        }
    }

    /// A number too large for any field (`1e400`) is named by its path
    /// through `from_document`, not by a line and column alone.
    #[test]
    fn an_out_of_range_number_names_its_field() {
        let doc = SEED.replace("\"requestsPerSecond\": 50", "\"requestsPerSecond\": 1e400");
        for e in [
            PressureConfig::from_document("kb.config.json", &doc),
            PressureConfig::from_json("kb.config.json", &doc),
        ] {
            let e = e.unwrap_err().to_string();
            assert!(
                e.contains("gateway.pressure.perService.rest.requestsPerSecond"),
                "{e}"
            );
        }
    }

    #[test]
    fn document_without_pressure_is_an_error() {
        let e = PressureConfig::from_document("x.json", r#"{"gateway": {}}"#).unwrap_err();
        assert!(e.to_string().contains("no `pressure`"), "{e}");
    }
}
