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
//! `cargo bench --bench http_layer`

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use broker_axum::{FromHeader, Pressure, PressureConfig};
use broker_core::ResourceBroker;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderName, Request};
use http_body_util::BodyExt;
use tower::{ServiceBuilder, ServiceExt};

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

/// tower_governor with one global key, limits far above the load.
fn governor_global() -> tower_governor::GovernorLayer<
    tower_governor::key_extractor::GlobalKeyExtractor,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
    Body,
> {
    let config = tower_governor::governor::GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
        .finish()
        .unwrap();
    tower_governor::GovernorLayer::new(config)
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

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("http_layer");

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
    let governor = handler_router().layer(governor_global());
    let governor_and_keyed = handler_router().layer(
        ServiceBuilder::new()
            .layer(governor_global())
            .layer(tower_governor::GovernorLayer::new(
                tower_governor::governor::GovernorConfigBuilder::default()
                    .per_nanosecond(1)
                    .burst_size(u32::MAX)
                    .key_extractor(TenantHeader)
                    .finish()
                    .unwrap(),
            )),
    );

    for (name, app) in [
        ("no_layer", none),
        ("pressure_route_rate_only", route_rate_only),
        ("pressure_route", route_only),
        ("pressure_route_and_tenant", route_and_tenant),
        ("tower_governor", governor),
        ("tower_governor_global_and_keyed", governor_and_keyed),
    ] {
        // Sanity: the variant admits the request.
        let status = rt
            .block_on(app.clone().oneshot(request()))
            .unwrap()
            .status();
        assert_eq!(status, 200, "{name}");
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| {
                let app = app.clone();
                async move {
                    let res = app.oneshot(request()).await.unwrap();
                    res.into_body().collect().await.unwrap().to_bytes()
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
