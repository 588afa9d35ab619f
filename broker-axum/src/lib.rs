//! # broker-axum
//!
//! Inbound pressure for axum and any tower stack, on the same
//! [`ResourceBroker`](broker_core::ResourceBroker) that outbound callers use.
//!
//! - [`Pressure`] registers a `pressure` config ([`PressureConfig`]) on a
//!   broker and makes two layers: [`Pressure::layer`], the route/service
//!   stage before authentication (a per-route override by path prefix beats
//!   the per-service limit), and [`Pressure::tenant_layer`], the per-tenant
//!   stage after it, keyed by a [`TenantExtractor`].
//! - A denial answers at once: `429` with `Retry-After` in whole seconds
//!   rounded up (never 0) and the draft `RateLimit-Policy` header (each
//!   rate's quota per window) with, when the limit that ran out is known
//!   (one rate limit, and not a concurrency denial), the `RateLimit`
//!   header ([`Responses`] configures status, body, legacy headers). A
//!   request denied by the tenant stage, or refused there on a backend
//!   failure, gets its route/service cost back.
//! - `maxConcurrentRequests`: the permit travels in the response body
//!   ([`PressureBody`], via [`PermitBody`]) and is released when the body
//!   ends, fails or is dropped (client abort). A response that switches
//!   protocols (`101`: a WebSocket), a `CONNECT` answered `2xx` and a
//!   `text/event-stream` response release it as soon as the response
//!   head is ready. It is the response that decides: a request with an
//!   `Upgrade` field answered as any other holds its slot to the end; a
//!   body of known length holds it whatever its content type.
//!   Over HTTP/1 the slot is held while the body goes out: a body of more
//!   than 16 KiB frees it once the server has taken its last frame and
//!   its write buffer has room again (a client that stops reading keeps
//!   it), a smaller one as the server takes its last frame in. Over
//!   HTTP/2, hyper hands a body's frames to the connection's send buffer
//!   once the stream has a byte of flow-control window, and drops the
//!   body at its end: the slot comes free when the body has been
//!   produced, not when the client has read it. Bound what clients that
//!   stall their window can hold with the server's HTTP/2 settings
//!   (`max_concurrent_streams`, `max_send_buf_size`).
//! - A backend failure the broker does not absorb (`BrokerError::Backend`)
//!   answers [`Responses::backend_error_status`] (default `503` with
//!   `Retry-After: 1`); the broker counts it (`backendErrors` in the stats)
//!   and warns about it. It never becomes a 500 or a panic.
//! - One `tracing` event per denial (`resource`, `layer`, `wait_ms`,
//!   `tenant`: the tenant's fingerprint); nothing per allowed request.
//! - The services keep the inner service's error type *and* body type
//!   (`axum::body::Body`, or any [`PermitBody`]), so they compose with axum
//!   0.8 `Router::layer` and any tower stack; a response holding no permit
//!   passes with its body untouched.
//! - With axum, give the whole stack to one `Router::layer` call
//!   (`ServiceBuilder::new().layer(pressure.layer()).layer(auth).layer(pressure.tenant_layer(..))`):
//!   axum boxes and clones each layer it is given, per request.
//! - [`stats_router`] serves `GET /admin/pressure/stats` (opt-in).
//!
//! ## Memory per tenant
//! The layers keep nothing per tenant. Each tenant is a sub-key of one
//! registered resource; the backend creates its state on first sight and
//! evicts it once idle (broker-memory sweeps idle states as the map grows;
//! broker-redis keys expire).
//!
//! A state is idle once its bucket has refilled (for one request,
//! `period ÷ amount`: 10 ms at 6,000 a minute, 6 minutes at 10 an hour),
//! so a flood of R new ids a second keeps about R × that many states. The
//! in-memory store also bounds their number
//! (`MemoryBackend::max_states`, 1,048,576 unless set; a million one-rate
//! states take about 240 MiB): past it, the least recently taken-from
//! tenants' states are folded into a fixed table of places, and a tenant
//! made again starts from its place, never with more than it had (no
//! tenant's limit is multiplied by a flood). The first tenants folded into
//! each group of eight places (such as tenants light before a flood) get
//! back what they had; the others share their group's state, which a
//! heavy flood of new ids drains, so they and new tenants may be denied
//! until it refills. Below the bound, and on Redis, the tenant stage
//! denies no other tenant for a flood of new ids (the route and service
//! limits count its requests). Tenants in use stay held. On Redis, tenant
//! states are keys that expire once idle: size
//! Redis's memory for R × that time, with the `noeviction` policy (the
//! backend warns on any other).
//!
//! ## Tenant ids
//! Tenant ids are user data, often secrets (an API key): they reach keys
//! and logs only as a fingerprint, `~` and the first 128 bits of an
//! HMAC-SHA256 of the id ([`Pressure::tenant_key`] gives it), so no id
//! can touch another tenant's state or leak through a log line or a Redis
//! key. A text id and the bytes of a header value that is not UTF-8
//! ([`Tenant`]) are fingerprinted under different tags, so they never
//! share a state. The HMAC key is [`Pressure::with_tenant_secret`]'s,
//! which every replica on one shared store must share; without it, a
//! built-in public key, the same everywhere: a guessable id (a user
//! number, an e-mail address) can then be tested against its fingerprint,
//! an API key cannot. Changing the secret starts every tenant afresh; a
//! replica with another one keys each tenant apart, so its limit is
//! enforced once per secret. For debugging, `perTenant.clearIds` keeps
//! plain ids (1 to 64 bytes of `[A-Za-z0-9._@+-]`) in clear.
//!
//! ## Semantics worth knowing
//! - The route/service stage runs before authentication, so it counts every
//!   request, authenticated or not: it is the floor against floods. A
//!   request the tenant stage denies gives that cost back (`settle` to
//!   zero), so one tenant's rejected flood does not use up the shared limit;
//!   so does one whose client leaves while the tenant stage's decision is
//!   in flight (it never reached its handler). A request that reached its
//!   handler keeps the cost, even when the handler answers with a tenant
//!   denial of a nested call through the same [`Pressure`] (a request it
//!   builds anew), whether a tenant stage of the request's own let it in
//!   or the route has none, and whether the nested call went through the
//!   tenant stage alone or the whole stack (its own route stage gets its
//!   cost back, the outer one keeps its own) (two tenant stages of one `Pressure` on one
//!   request are one stage here: a denial by the inner one refunds the
//!   route/service stage nothing).
//! - Route prefixes match the request path as the layer sees it (put the
//!   layer on the outermost router, not inside a `nest`), on segment
//!   boundaries; the longest matching prefix wins. A path a wildcard
//!   handler may read as another (`%2F` for `/`, a `.` or empty segment)
//!   meets the limits of both readings.
//! - A response holds its slot until its body ends, however long that
//!   takes: in memory the slot is the permit's until it is released; on a
//!   shared store (Redis) the permit is a lease of the resource's
//!   `lease_ttl` (60 s by default) that the broker renews while the permit
//!   lives, so it lapses when its process dies, or when Redis loses it (out
//!   of reach for longer than the TTL, a restart, a failover) and another
//!   holder takes the slot before the next renewal takes it again. Event
//!   streams and upgrades hold none once their head is out.
//! - Store failures: the store's failure policy answers first (a
//!   `broker_core::Failover` over Redis: fail-closed, fail-open or local
//!   fallback); only an error that policy does not absorb reaches the layer, which
//!   answers [`Responses::backend_error_status`] and lets the request go no
//!   further.
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
