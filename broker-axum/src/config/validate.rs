//! What serde cannot check in a `pressure` config.

use std::collections::HashSet;

use broker_core::{ConfigError, Limits, Unit};

use super::{service_resource, PressureConfig};

impl PressureConfig {
    /// Checks what serde cannot: path prefixes, resource ids, duplicates, an
    /// enabled tenant stage without limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("<config>", "")
    }

    pub(super) fn validate_at(&self, source_name: &str, prefix: &str) -> Result<(), ConfigError> {
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
            let prefix_field = || format!("{field}.pathPrefix");
            check_prefix(&route.path_prefix).map_err(|r| bad(prefix_field(), &r))?;
            // Compared as paths are (see `policy::normal_path`).
            if !prefixes.insert(crate::policy::normal_path(&route.path_prefix).into_owned()) {
                return Err(bad(
                    prefix_field(),
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

/// The layers charge requests, never tokens: a token rate would limit nothing.
fn check_requests(limits: &Limits) -> Result<(), &'static str> {
    match limits.rates.iter().any(|r| r.unit == Unit::Tokens) {
        true => Err(
            "a rate in tokens (`tokensPerMinute`) limits nothing here: the layers \
                     charge one request per request and no tokens; use a rate in requests",
        ),
        false => Ok(()),
    }
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
    match template_segment(prefix) {
        Some(segment) => Err(format!(
            "holds `{segment}`, a route template's parameter: a prefix is \
             matched literally, segment by segment; write the part before the \
             parameter (a segment meant literally: percent-encode its first \
             character, e.g. `%3A`)"
        )),
        None => Ok(()),
    }
}

/// The first segment of `prefix` that reads as a route template's parameter
/// (`{id}`, `:id`, `*rest`): a literal prefix would never match it.
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
