//! Inbound pressure for axum and tower on a shared [`broker_core::ResourceBroker`]:
//! [`Pressure::layer`] limits per route or service before authentication,
//! [`Pressure::tenant_layer`] per tenant after it; a denial answers `429` ([`Responses`]).
//!
//! ```
//! use broker_axum::{Pressure, PressureConfig};
//! use broker_core::ResourceBroker;
//!
//! let config = PressureConfig::from_json("inline", r#"{
//!     "enabled": true,
//!     "perService": { "rest": { "requestsPerSecond": 50 } },
//!     "perRoute": [{
//!         "resource": "gateway:route:webhooks-github",
//!         "pathPrefix": "/api/v1/webhooks/github",
//!         "limits": { "requestsPerSecond": 100, "maxConcurrentRequests": 200 }
//!     }]
//! }"#).unwrap();
//! let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
//! let pressure = Pressure::new(broker.clone(), &config).unwrap();
//! let app: axum::Router = axum::Router::new()
//!     .route("/api/v1/webhooks/github", axum::routing::post(|| async { "queued" }))
//!     .layer(pressure.layer())
//!     .merge(broker_axum::stats_router(broker));
//! # let _ = app;
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admission;
mod body;
pub mod config;
mod policy;
mod pressure;
mod response;
mod route;
mod stats;
mod tenant;

pub use admission::ResponseFuture;
pub use body::PermitBody;
pub use config::{PressureConfig, RouteConfig, TenantConfig};
pub use pressure::Pressure;
pub use response::Responses;
pub use route::{PressureLayer, PressureService};
pub use stats::{stats_router, PressureStats, ResourceView, STATS_PATH};
pub use tenant::{FromExtension, FromHeader, Tenant, TenantExtractor, TenantLayer, TenantService};
