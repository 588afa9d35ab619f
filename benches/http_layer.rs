//! Overhead of the inbound pressure layer on an axum router, in memory, side
//! by side with no layer and with tower_governor, in one run.
//!
//! `pressure_route_rate_only` is the route stage with a rate limit only,
//! `pressure_route` adds a concurrency limit (a permit carried by the
//! response body), `pressure_route_and_tenant` adds the tenant stage (a
//! keyed rate limit) in the same `Router::layer` call; `tower_governor` is
//! one global governor layer, `tower_governor_global_and_keyed` adds a
//! second one keyed by the same tenant header, stacked the same way.
//!
//! Every variant serves the same handler and the limits are far above the
//! request rate, so every request is admitted: the figures are the cost of
//! the check itself (plus, for the pressure layer, taking and releasing a
//! concurrency permit carried in the response body).
//!
//! `pressure_rate_only_route_and_tenant` is the two stages with rate limits
//! only (what two governor layers express), and
//! `tower_governor_global_concurrency_and_keyed` is the stack of
//! `http_load_server --layer governor` (global governor, tower's
//! concurrency limit, keyed governor), the counterpart of
//! `pressure_route_and_tenant`.
//!
//! Before criterion runs, the bench prints the heap allocations per request
//! of each variant (a counting global allocator);
//! `HTTP_LAYER_RUN=<variant>:<requests>` prints them for that variant alone
//! and exits.
#![forbid(unsafe_code)]

use std::alloc::System;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use broker_axum::{FromExtension, FromHeader, Pressure, PressureConfig};
use broker_core::ResourceBroker;
use criterion::{criterion_group, Criterion};
use http::{HeaderName, Request};
use http_body_util::BodyExt;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::{ServiceBuilder, ServiceExt};

/// The system allocator, counting allocations (reallocations included) and
/// the bytes asked for (`stats_alloc`).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn handler_router() -> Router {
    Router::new().route("/api/v1/webhooks/{source}", post(|| async { "queued" }))
}

fn request() -> Request<Body> {
    Request::post("/api/v1/webhooks/stripe")
        .header("x-tenant", "acme")
        .body(Body::empty())
        .unwrap()
}

fn pressure(tenant: bool, concurrency: bool) -> Pressure {
    let concurrency = if concurrency {
        r#", "maxConcurrentRequests": 100000"#
    } else {
        ""
    };
    let json = format!(
        r#"{{
        "perRoute": [{{
            "resource": "gateway:route:webhooks",
            "pathPrefix": "/api/v1/webhooks",
            "limits": {{ "requestsPerSecond": 1000000000000{concurrency} }}
        }}],
        "perTenant": {{ "enabled": {tenant}, "limits": {{ "requestsPerSecond": 1000000000000 }} }}
    }}"#
    );
    let config = PressureConfig::from_json("bench", &json).unwrap();
    let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
    Pressure::new(broker, &config).unwrap()
}

/// tower_governor keyed by the `x-tenant` header (the per-tenant stage).
#[derive(Clone)]
struct TenantHeader;

impl tower_governor::key_extractor::KeyExtractor for TenantHeader {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.headers()
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// tower_governor keyed by `key`, with a quota that never denies.
fn governor_by<K: tower_governor::key_extractor::KeyExtractor>(
    key: K,
) -> tower_governor::GovernorLayer<
    K,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
    Body,
> {
    tower_governor::GovernorLayer::new(
        tower_governor::governor::GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .key_extractor(key)
            .finish()
            .unwrap(),
    )
}

/// The tenant, as the example's authentication puts it in the request.
#[derive(Clone)]
struct Tenant(String);

/// The example's authentication, reduced to taking the tenant from the
/// `x-tenant` header.
async fn authenticate(
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let tenant = req
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(|t| Tenant(t.to_owned()));
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(tenant);
    }
    next.run(req).await
}

/// tower_governor keyed by the [`Tenant`] extension, as the example's.
#[derive(Clone)]
struct TenantExtension;

impl tower_governor::key_extractor::KeyExtractor for TenantExtension {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.extensions()
            .get::<Tenant>()
            .map(|t| t.0.clone())
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// The example's pressure stack: route stage, authentication, tenant
/// stage keyed from the extension.
fn example_pressure(concurrency: bool) -> Router {
    let p = pressure(true, concurrency);
    handler_router().layer(
        ServiceBuilder::new()
            .layer(p.layer())
            .layer(axum::middleware::from_fn(authenticate))
            .layer(p.tenant_layer(FromExtension::new(|t: &Tenant| t.0.as_str()))),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Every variant, by name.
fn variants() -> Vec<(&'static str, Router)> {
    let none = handler_router();
    let route_rate_only = handler_router().layer(pressure(false, false).layer());
    let route_only = handler_router().layer(pressure(false, true).layer());
    let route_and_tenant = {
        let p = pressure(true, true);
        handler_router().layer(
            ServiceBuilder::new()
                .layer(p.layer())
                .layer(p.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant")))),
        )
    };
    let rate_only_route_and_tenant = {
        let p = pressure(true, false);
        handler_router().layer(
            ServiceBuilder::new()
                .layer(p.layer())
                .layer(p.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant")))),
        )
    };
    let disabled = {
        let config = PressureConfig::from_json(
            "bench",
            r#"{"enabled": false, "perService": {"rest": {"requestsPerSecond": 1}},
                "perTenant": {"enabled": true, "limits": {"requestsPerSecond": 1}}}"#,
        )
        .unwrap();
        let p = Pressure::new(
            ResourceBroker::new(broker_memory::MemoryBackend::new()),
            &config,
        )
        .unwrap();
        handler_router().layer(
            ServiceBuilder::new()
                .layer(p.layer())
                .layer(p.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant")))),
        )
    };
    let governor = handler_router().layer(governor_by(
        tower_governor::key_extractor::GlobalKeyExtractor,
    ));
    let governor_and_keyed = handler_router().layer(
        ServiceBuilder::new()
            .layer(governor_by(
                tower_governor::key_extractor::GlobalKeyExtractor,
            ))
            .layer(governor_by(TenantHeader)),
    );
    let governor_concurrency_and_keyed = handler_router().layer(
        ServiceBuilder::new()
            .layer(governor_by(
                tower_governor::key_extractor::GlobalKeyExtractor,
            ))
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(100_000))
            .layer(governor_by(TenantHeader)),
    );
    let example_none = handler_router().layer(axum::middleware::from_fn(authenticate));
    let example_governor = handler_router().layer(
        ServiceBuilder::new()
            .layer(governor_by(
                tower_governor::key_extractor::GlobalKeyExtractor,
            ))
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(100_000))
            .layer(axum::middleware::from_fn(authenticate))
            .layer(governor_by(TenantExtension)),
    );
    let example_governor_rate_only = handler_router().layer(
        ServiceBuilder::new()
            .layer(governor_by(
                tower_governor::key_extractor::GlobalKeyExtractor,
            ))
            .layer(axum::middleware::from_fn(authenticate))
            .layer(governor_by(TenantExtension)),
    );
    vec![
        ("no_layer", none),
        ("pressure_route_rate_only", route_rate_only),
        ("pressure_route", route_only),
        ("pressure_route_and_tenant", route_and_tenant),
        (
            "pressure_rate_only_route_and_tenant",
            rate_only_route_and_tenant,
        ),
        ("pressure_disabled", disabled),
        ("tower_governor", governor),
        ("tower_governor_global_and_keyed", governor_and_keyed),
        (
            "tower_governor_global_concurrency_and_keyed",
            governor_concurrency_and_keyed,
        ),
        ("example_no_layer", example_none),
        ("example_pressure", example_pressure(true)),
        ("example_pressure_rate_only", example_pressure(false)),
        ("example_governor", example_governor),
        ("example_governor_rate_only", example_governor_rate_only),
    ]
    .into_iter()
    // As `axum::serve` does: the routes are made (and the layers applied)
    // once, not per request.
    .map(|(name, app)| (name, app.with_state(())))
    .collect()
}

/// One request through `app`, its response body read to the end.
async fn one(app: &Router) -> axum::body::Bytes {
    let res = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(res.status(), 200);
    res.into_body().collect().await.unwrap().to_bytes()
}

/// `n` requests through `app`.
fn requests(rt: &tokio::runtime::Runtime, app: &Router, n: u64) {
    rt.block_on(async {
        for _ in 0..n {
            std::hint::black_box(one(app).await);
        }
    });
}

/// Heap allocations and bytes per request, after a warm-up.
fn allocations(rt: &tokio::runtime::Runtime, app: &Router, n: u64) -> (f64, f64) {
    requests(rt, app, 1000);
    let region = Region::new(GLOBAL);
    requests(rt, app, n);
    let change = region.change();
    let allocs = change.allocations + change.reallocations;
    let bytes = change.bytes_allocated as f64 + change.bytes_reallocated.max(0) as f64;
    (allocs as f64 / n as f64, bytes / n as f64)
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("http_layer");
    for (name, app) in variants() {
        let (allocs, bytes) = allocations(&rt, &app, 10_000);
        println!("http_layer/{name}: {allocs:.2} allocations, {bytes:.0} bytes per request");
        group.bench_function(name, |b| b.to_async(&rt).iter(|| one(&app)));
    }
    group.finish();
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(run) = std::env::var("HTTP_LAYER_RUN") {
        let (name, n) = run
            .split_once(':')
            .and_then(|(name, n)| Some((name, n.parse::<u64>().ok()?)))
            .expect("HTTP_LAYER_RUN=<variant>:<requests>");
        let (_, app) = variants()
            .into_iter()
            .find(|(v, _)| *v == name)
            .unwrap_or_else(|| panic!("no variant {name}"));
        let rt = runtime();
        let (allocs, bytes) = allocations(&rt, &app, n);
        println!("{name}: {n} requests, {allocs:.2} allocations, {bytes:.0} bytes per request");
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
