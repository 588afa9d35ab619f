//! The shared, immutable state of one [`crate::Pressure`]; limiter state
//! lives in the broker.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use broker_core::{ConfigError, Limits, OnOtherLimits, ResourceBroker};

use crate::config::{service_resource, PressureConfig};
use crate::response::Responses;
use crate::tenant::TenantKeys;

mod limited;
mod paths;
mod stage;

pub(crate) use limited::Limited;
use limited::{not_registered, Wanted};
pub(crate) use stage::Stage;
use stage::SERVICE;

pub(crate) use paths::normal_path;
use paths::{has_dot_or_empty_segment, has_encoded_slash, prefix_matches, second_reading};

#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// In the form of [`normal_path`].
    prefix: Box<[u8]>,
    /// The prefix as a wildcard handler reads it, when different.
    slashed: Option<Box<[u8]>>,
    pub(crate) limited: Limited,
}

impl Route {
    /// The prefix as a wildcard handler reads it: `%2F` a `/`, no dot or
    /// empty segments.
    fn slashed(&self) -> &[u8] {
        self.slashed.as_deref().unwrap_or(&self.prefix)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Unique per [`Policy::new`], so the stages of one `Pressure` know each other.
    pub(crate) id: u64,
    pub(crate) broker: ResourceBroker,
    pub(crate) enabled: bool,
    /// Longest prefix first.
    routes: Vec<Route>,
    /// Whether a route's prefix holds a `%2F`.
    slashed_prefixes: bool,
    service: Option<Limited>,
    tenant: Option<Limited>,
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
    ) -> Result<Self, ConfigError> {
        config.validate()?;
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
        if config.per_route.len() >= SERVICE as usize {
            return Err(ConfigError::invalid(
                "perRoute",
                "more routes than a u32 counts",
            ));
        }
        let service = service.map(|(name, limits)| Wanted {
            field: format!("perService.{name}"),
            id: service_resource(name),
            limits,
        });
        let routes: Vec<_> = (config.per_route.iter().enumerate())
            .map(|(i, r)| Wanted {
                field: format!("perRoute[{i}].resource"),
                id: r.resource.clone(),
                limits: &r.limits,
            })
            .collect();
        let tenant = config.per_tenant.enabled.then(|| Wanted {
            field: "perTenant.resource".to_owned(),
            id: config.per_tenant.resource.clone(),
            limits: &config.per_tenant.limits,
        });
        let wanted: Vec<&Wanted> = service.iter().chain(&routes).chain(&tenant).collect();
        let entries: Vec<(&str, &Limits)> = wanted.iter().map(|w| (&*w.id, w.limits)).collect();
        (broker.register_limits(&entries, on_other))
            .map_err(|e| not_registered(e, &wanted, on_other))?;
        let limited = |w: &Wanted| Limited::on(&broker, &w.id, w.limits);
        let service = service.as_ref().map(limited).transpose()?;
        let mut routes = (config.per_route.iter().zip(&routes))
            .map(|(r, wanted)| {
                let prefix: Box<[u8]> = normal_path(&r.path_prefix).into();
                let second = second_reading(r.path_prefix.as_bytes());
                Ok(Route {
                    slashed: (*second != *prefix).then(|| second.into()),
                    prefix,
                    limited: limited(wanted)?,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        let slashed_prefixes = routes.iter().any(|r| r.slashed.is_some());
        let tenant = tenant.as_ref().map(limited).transpose()?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            broker,
            enabled: config.enabled,
            routes,
            slashed_prefixes,
            service,
            tenant,
            tenant_keys: TenantKeys::new(None, config.per_tenant.clear_ids),
            responses: Responses::default(),
        })
    }

    /// The stage limiting `path` before authentication: the longest matching
    /// route, else the service (a non-path such as `*` reads as `/`). A path
    /// that a wildcard handler reads differently (`%2F`, `.` or empty
    /// segments) and so meets two stages gets [`Stage::Both`], charged on both.
    pub(crate) fn stage_for(&self, path: &str) -> Option<(Stage, &Limited)> {
        if !self.enabled {
            return None;
        }
        let form = match path.starts_with('/') {
            true => normal_path(path),
            false => Cow::Borrowed(&b"/"[..]),
        };
        let path = path.as_bytes();
        let found = (0u32..)
            .zip(&self.routes)
            .find_map(|(i, r)| prefix_matches(&form, &r.prefix).then_some(i));
        let routed = self.route_or_service(found);
        let second =
            self.slashed_prefixes || has_encoded_slash(path) || has_dot_or_empty_segment(&form);
        if !path.starts_with(b"/") || !second {
            return routed;
        }
        // The longest slashed prefix that matches; on a tie, not the
        // router's, so both are charged.
        let slashed_path = second_reading(path);
        let mut best: Option<(usize, u32)> = None;
        for (i, route) in (0u32..).zip(&self.routes) {
            let prefix = route.slashed();
            let better = best.is_none_or(|(len, at)| {
                prefix.len() > len || (prefix.len() == len && Some(at) == found)
            });
            if better && prefix_matches(&slashed_path, prefix) {
                best = Some((prefix.len(), i));
            }
        }
        let slashed = self.route_or_service(best.map(|(_, i)| i));
        match (routed, slashed) {
            (Some((a, limited)), Some((b, _))) if a != b => {
                // Route and service stages always have a place.
                let both = a.place().zip(b.place()).map(|(a, b)| Stage::Both(a, b));
                Some((both.unwrap_or(a), limited))
            }
            (None, slashed) => slashed,
            (routed, _) => routed,
        }
    }

    /// The route (`found`), else the service stage.
    fn route_or_service(&self, found: Option<u32>) -> Option<(Stage, &Limited)> {
        let stage = found.map_or(Stage::Service, Stage::Route);
        Some((stage, self.limited(stage)?))
    }

    /// Whether the tenant stage limits anything.
    pub(crate) fn has_tenant_stage(&self) -> bool {
        self.enabled && self.tenant.is_some()
    }

    /// The resource of `stage` (none for [`Stage::Both`]: see its
    /// [`Stage::parts`]).
    pub(crate) fn limited(&self, stage: Stage) -> Option<&Limited> {
        match stage {
            Stage::Route(i) => self.routes.get(i as usize).map(|r| &r.limited),
            Stage::Service => self.service.as_ref(),
            Stage::Tenant => self.tenant.as_ref(),
            Stage::Both(..) => None,
        }
    }
}

#[cfg(test)]
mod tests;
