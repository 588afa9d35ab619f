//! Overhead of the inbound pressure layer on an axum router, in memory, side
//! by side with no layer and with tower_governor, in one run.
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
use tower::ServiceExt;

fn handler_router() -> Router {
    Router::new().route("/api/v1/webhooks/{source}", post(|| async { "queued" }))
}

fn request() -> Request<Body> {
    Request::post("/api/v1/webhooks/stripe")
        .header("x-tenant", "acme")
        .body(Body::empty())
        .unwrap()
}

fn pressure(tenant: bool) -> Pressure {
    let json = format!(
        r#"{{
        "perRoute": [{{
            "resource": "gateway:route:webhooks",
            "pathPrefix": "/api/v1/webhooks",
            "limits": {{ "requestsPerSecond": 1000000000000, "maxConcurrentRequests": 100000 }}
        }}],
        "perTenant": {{ "enabled": {tenant}, "limits": {{ "requestsPerSecond": 1000000000000 }} }}
    }}"#
    );
    let config = PressureConfig::from_json("bench", &json).unwrap();
    let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
    Pressure::new(broker, &config).unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("http_layer");

    let none = handler_router();
    let route_only = {
        let p = pressure(false);
        handler_router().layer(p.layer())
    };
    let route_and_tenant = {
        let p = pressure(true);
        handler_router()
            .layer(p.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
            .layer(p.layer())
    };
    let governor = {
        use tower_governor::governor::GovernorConfigBuilder;
        use tower_governor::key_extractor::GlobalKeyExtractor;
        use tower_governor::GovernorLayer;
        let config = GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .key_extractor(GlobalKeyExtractor)
            .finish()
            .unwrap();
        handler_router().layer(GovernorLayer::new(config))
    };

    for (name, app) in [
        ("no_layer", none),
        ("pressure_route", route_only),
        ("pressure_route_and_tenant", route_and_tenant),
        ("tower_governor", governor),
    ] {
        // Sanity: the variant admits the request.
        let status = rt.block_on(app.clone().oneshot(request())).unwrap().status();
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
