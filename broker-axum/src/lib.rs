//! # broker-axum
//!
//! Inbound pressure for axum and any tower stack, on the same
//! [`ResourceBroker`](broker_core::ResourceBroker) that outbound callers use.
//!
//! - [`Pressure`] registers a [`PressureConfig`] on a broker and makes two
//!   layers: [`Pressure::layer`] (route/service, before authentication; the
//!   longest matching route prefix beats the service limit) and
//!   [`Pressure::tenant_layer`] (per tenant, after it, keyed by a [`TenantExtractor`]).
//! - A denial answers `429` at once, with `Retry-After` in whole seconds (never 0)
//!   and the draft `RateLimit-Policy` / `RateLimit` headers ([`Responses`]).
//!   A request the tenant stage denies gets its route/service cost back.
//! - `maxConcurrentRequests`: the permit travels in the response body
//!   ([`PressureBody`]) and is released when the body ends, fails or is
//!   dropped; a `101`, a `CONNECT` answered `2xx` or an event stream
//!   releases it once the head is ready. Over HTTP/2 the slot frees when the
//!   body is produced; bound stalled clients with the server's HTTP/2 settings.
//! - A backend failure the broker does not absorb answers
//!   [`Responses::backend_error_status`] (default `503`, `Retry-After: 1`),
//!   never a 500 or a panic.
//! - One `tracing` event per denial (the tenant as a fingerprint); none per
//!   allowed request. The services keep the inner error and body types.
//! - With axum, give the whole stack to one `Router::layer` call (axum clones
//!   each layer per request). [`stats_router`] serves `GET /admin/pressure/stats`.
//!
//! ## Memory per tenant
//! The layers keep nothing per tenant: each tenant is a sub-key whose state
//! the backend drops once idle (refilled). The memory store also bounds the
//! number of states (`MemoryBackend::max_states`), folding the oldest into a
//! fixed table so no tenant gains from a flood; Redis keys expire (use `noeviction`).
//!
//! ## Tenant ids
//! Tenant ids reach keys and logs only as a fingerprint: `~` and 128 bits of
//! an HMAC-SHA256 ([`Pressure::tenant_key`]), keyed by
//! [`Pressure::with_tenant_secret`] (share it across replicas; without it a
//! public key, so guessable ids can be tested). Text and byte ids never share
//! a state. `perTenant.clearIds` keeps plain ids for debugging.
//!
//! ## Semantics worth knowing
//! - The route/service stage counts every request, authenticated or not;
//!   a request the tenant stage denies gets that cost back. A request that
//!   reached its handler keeps its cost.
//! - Route prefixes match the path as the layer sees it (put it on the
//!   outermost router), on segment boundaries; a path with `%2F` or `.`
//!   segments meets the limits of every reading.
//! - On Redis a slot is a lease of `lease_ttl` renewed while the permit
//!   lives, so it lapses when its process dies.
//! - Store failures: the store's failure policy answers first (a
//!   `broker_core::Failover`); an error it does not absorb answers
//!   [`Responses::backend_error_status`].
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

pub use body::{PermitBody, PressureBody};
pub use config::{PressureConfig, RouteConfig, TenantConfig};
pub use pressure::Pressure;
pub use response::{
    retry_after_secs, Responses, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use route::{PressureLayer, PressureService, ResponseFuture};
pub use stats::{stats_router, PressureStats, ResourceView, STATS_PATH};
pub use tenant::{
    FromExtension, FromHeader, Tenant, TenantExtractor, TenantFuture, TenantLayer, TenantService,
    MAX_TENANT_LEN,
};
