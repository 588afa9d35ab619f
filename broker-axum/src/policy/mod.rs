//! The shared, immutable state of one [`crate::Pressure`]; limiter state
//! lives in the broker.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use broker_core::{ConfigError, Limits, OnOtherLimits, ResourceBroker, ResourceHandle};

use crate::config::{service_resource, PressureConfig};
use crate::response::Responses;
use crate::tenant::keys::TenantKeys;

mod paths;

pub(crate) use paths::normal_path;
use paths::{has_dot_or_empty_segment, prefix_matches, second_reading};

/// A resource the stages acquire on, and the `layer` field of log events
/// about it.
#[derive(Debug, Clone)]
pub(crate) struct Limited {
    pub(crate) handle: ResourceHandle,
    pub(crate) layer: &'static str,
}

/// The resources one admission charges (indices into the policy's), in
/// order: one, or two for a path read two ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stage(pub(crate) u32, pub(crate) Option<u32>);

impl Stage {
    pub(crate) fn parts(self) -> impl Iterator<Item = u32> {
        std::iter::once(self.0).chain(self.1)
    }
}

#[derive(Debug, Clone)]
struct Route {
    /// In the form of [`normal_path`].
    prefix: Box<[u8]>,
    /// The prefix as a wildcard handler reads it ([`second_reading`]).
    slashed: Box<[u8]>,
    /// Its resource in [`Policy::limited`].
    at: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Unique per [`Policy::new`], so the stages of one `Pressure` know each other.
    pub(crate) id: u64,
    pub(crate) broker: ResourceBroker,
    /// The service's, the routes' and the tenant's resources, in that order.
    limited: Vec<Limited>,
    /// Longest prefix first; none, as no service or tenant, when disabled.
    routes: Vec<Route>,
    /// Whether a route's prefix reads differently the second way.
    slashed_prefixes: bool,
    service: Option<u32>,
    /// The tenant stage, when it limits anything.
    pub(crate) tenant: Option<Stage>,
    /// How tenant ids become sub-keys.
    pub(crate) tenant_keys: TenantKeys,
    pub(crate) responses: Responses,
}

impl Policy {
    /// Registers the resources of `config` on `broker`, all or none
    /// ([`ResourceBroker::register_limits`]); other limits as `on_other` says.
    pub(crate) fn new(
        broker: ResourceBroker,
        config: &PressureConfig,
        service: Option<&str>,
        on_other: OnOtherLimits,
    ) -> Result<Arc<Self>, ConfigError> {
        config.validate_at("<config>", "")?;
        let service = match service {
            Some(name) => Some(config.per_service.get_key_value(name).ok_or_else(|| {
                ConfigError::invalid(
                    format!("perService.{name}"),
                    "no such service in the config",
                )
            })?),
            None if config.per_service.len() > 1 => {
                return Err(ConfigError::invalid(
                    "perService",
                    "several services are configured: pick one with Pressure::for_service",
                ))
            }
            None => config.per_service.iter().next(),
        };
        // (field naming the id, id, limits, layer), in the order of `limited`.
        let mut wanted: Vec<(String, String, &Limits, &str)> = Vec::new();
        if let Some((name, limits)) = service {
            let field = format!("perService.{name}");
            wanted.push((field, service_resource(name), limits, "service"));
        }
        for (i, r) in config.per_route.iter().enumerate() {
            let field = format!("perRoute[{i}].resource");
            wanted.push((field, r.resource.clone(), &r.limits, "route"));
        }
        let tenant = &config.per_tenant;
        if tenant.enabled {
            let field = "perTenant.resource".to_owned();
            wanted.push((field, tenant.resource.clone(), &tenant.limits, "tenant"));
        }
        let entries: Vec<(&str, &Limits)> = wanted.iter().map(|w| (&*w.1, w.2)).collect();
        // A refusal names the field that gives the id.
        if let Err(e) = broker.register_limits(&entries, on_other) {
            let (ConfigError::Taken { .. }, Some((field, ..))) = (&e.error, wanted.get(e.index))
            else {
                return Err(e.error);
            };
            let reload = match on_other {
                OnOtherLimits::Refuse => ", or build with Pressure::reload to re-configure it",
                OnOtherLimits::Replace => "",
            };
            let why = "(another config's, or the application's own): give it an id of its own";
            let message = format!("{} {why}{reload}", e.error);
            return Err(ConfigError::invalid(field, message));
        }
        let limited = (wanted.iter())
            .map(|&(_, ref id, _, layer)| {
                let handle = (broker.resource_handle(id))
                    .map_err(|e| ConfigError::invalid(id, e.to_string()))?;
                Ok(Limited { handle, layer })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let (first_route, on) = (u32::from(service.is_some()), config.enabled);
        let mut routes: Vec<Route> = (first_route..)
            .zip(&config.per_route)
            .filter(|_| on)
            .map(|(at, r)| Route {
                prefix: normal_path(&r.path_prefix).into(),
                slashed: second_reading(r.path_prefix.as_bytes()).into(),
                at,
            })
            .collect();
        routes.sort_by_key(|r| Reverse(r.prefix.len()));
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(Arc::new(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            broker,
            slashed_prefixes: routes.iter().any(|r| r.slashed != r.prefix),
            routes,
            service: service.filter(|_| on).map(|_| 0),
            tenant: (on && tenant.enabled).then(|| Stage(limited.len() as u32 - 1, None)),
            limited,
            tenant_keys: TenantKeys::new(None, tenant.clear_ids),
            responses: Responses::default(),
        }))
    }

    /// The stage limiting `path`: the longest matching route, else the service.
    /// A path read two ways (`%2F`, `.` or empty segments) is charged on both.
    pub(crate) fn stage_for(&self, path: &str) -> Option<Stage> {
        let form = match path.starts_with('/') {
            true => normal_path(path),
            false => Cow::Borrowed(&b"/"[..]),
        };
        let encoded_slash = path.contains("%2F") || path.contains("%2f");
        let second = self.slashed_prefixes || encoded_slash || has_dot_or_empty_segment(&form);
        let path = path.as_bytes();
        let found = (self.routes.iter()).position(|r| prefix_matches(&form, &r.prefix));
        let routed = self.route_or_service(found);
        if !path.starts_with(b"/") || !second {
            return routed.map(|at| Stage(at, None));
        }
        // The longest slashed prefix that matches; on a tie, not the
        // router's, so both are charged.
        let slashed_path = second_reading(path);
        let best = (self.routes.iter().enumerate())
            .filter(|(_, r)| prefix_matches(&slashed_path, &r.slashed))
            .min_by_key(|&(i, r)| (Reverse(r.slashed.len()), Some(i) == found));
        match (routed, self.route_or_service(best.map(|(i, _)| i))) {
            (Some(a), Some(b)) if a != b => Some(Stage(a, Some(b))),
            (None, slashed) => slashed.map(|b| Stage(b, None)),
            (routed, _) => routed.map(|a| Stage(a, None)),
        }
    }

    /// The resource of route `found`, else the service's.
    fn route_or_service(&self, found: Option<usize>) -> Option<u32> {
        found.map(|i| self.routes[i].at).or(self.service)
    }

    /// The resource at `at`.
    pub(crate) fn limited(&self, at: u32) -> &Limited {
        &self.limited[at as usize]
    }
}

#[cfg(test)]
mod tests;
