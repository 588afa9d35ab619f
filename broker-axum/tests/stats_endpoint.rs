//! `GET /admin/pressure/stats` over a real socket.

mod common;

use axum::routing::get;
use axum::Router;
use broker_axum::{stats_router, PressureStats, STATS_PATH};
use broker_core::Limits;
use common::{serve, statuses, TestBroker};

#[tokio::test]
async fn stats_endpoint_serves_counters_and_marks_limit_only_resources() {
    let t = TestBroker::new();
    let pressure = t.pressure(r#"{ "perService": { "rest": { "requestsPerMinute": 2 } } }"#);
    t.broker
        .register("llm", broker_core::ResourceConfig::new(Limits::new()))
        .unwrap();
    let app = Router::new()
        .route("/work", get(|| async { "ok" }))
        .layer(pressure.layer())
        .merge(stats_router(t.broker.clone()));
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    statuses(&client, &format!("http://{addr}/work"), None, 3).await;

    let res = client
        .get(format!("http://{addr}{STATS_PATH}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    let stats: PressureStats = serde_json::from_str(&text).unwrap();
    let rest = &stats.resources["pressure:service:rest"];
    assert!(rest.limit_only);
    assert_eq!((rest.stats.allowed, rest.stats.denied), (2, 1));
    assert!(!stats.resources["llm"].limit_only);
    assert!(text.contains("\"limitOnly\":true"), "{text}");
}
