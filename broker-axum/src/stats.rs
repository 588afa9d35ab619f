//! `GET /admin/pressure/stats`: the broker's counters as JSON.

use std::collections::BTreeMap;

use axum::routing::get;
use axum::{Json, Router};
use broker_core::{BackendHealth, ResourceBroker, ResourceKind, ResourceStats};
use serde::{Deserialize, Serialize};

/// The path [`stats_router`] serves.
pub const STATS_PATH: &str = "/admin/pressure/stats";

/// The stats document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PressureStats {
    /// Per resource id.
    pub resources: BTreeMap<String, ResourceView>,
    /// The store's reachability and the calls its failure policy answered
    /// (absent from an older document: up, nothing counted).
    #[serde(default)]
    pub backend: BackendHealth,
}

/// One resource's counters, marked when it is limit-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceView {
    /// True for check + reject resources (no queue: `queued` means nothing).
    pub limit_only: bool,
    /// The counters.
    #[serde(flatten)]
    pub stats: ResourceStats,
}

/// A router serving [`PressureStats`] at `GET /admin/pressure/stats`; mount
/// it behind your own authentication.
///
/// ```
/// use broker_core::ResourceBroker;
/// let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
/// let admin: axum::Router = broker_axum::stats_router(broker);
/// # let _ = admin;
/// ```
pub fn stats_router<S>(broker: ResourceBroker) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new().route(
        STATS_PATH,
        get(move || {
            let stats = broker.stats();
            let view = |(id, stats): (String, ResourceStats)| {
                let limit_only = stats.kind == ResourceKind::LimitOnly;
                (id, ResourceView { limit_only, stats })
            };
            let resources = stats.resources.into_iter().map(view).collect();
            let backend = stats.backend;
            async move { Json(PressureStats { resources, backend }) }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_without_the_store_health_reads_as_up() {
        let older = r#"{"resources": {}}"#;
        let stats: PressureStats = serde_json::from_str(older).unwrap();
        assert_eq!(stats.backend, BackendHealth::default());
        assert!(!stats.backend.down);
    }
}
