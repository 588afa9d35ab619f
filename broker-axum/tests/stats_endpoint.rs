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

/// During a store outage answered fail-open, the resources count every
/// request allowed and no backend error; the endpoint also serves the
/// store's health, which says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_endpoint_serves_the_store_health_during_an_outage() {
    use broker_core::FailurePolicy;
    use broker_redis::RedisBackend;
    use std::time::Duration;

    let mut redis = broker_testkit::RedisServer::start();
    let backend = RedisBackend::builder(&redis.url())
        .response_timeout(Duration::from_millis(200))
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .unwrap();
    let broker = broker_core::ResourceBroker::new(backend);
    let config = broker_axum::PressureConfig::from_json(
        "t",
        r#"{ "perService": { "rest": { "requestsPerSecond": 100 } } }"#,
    )
    .unwrap();
    let pressure = broker_axum::Pressure::new(broker.clone(), &config).unwrap();
    let app = Router::new()
        .route("/work", get(|| async { "ok" }))
        .layer(pressure.layer())
        .merge(stats_router(broker.clone()));
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let stats = || async {
        let text = client
            .get(format!("http://{addr}{STATS_PATH}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        serde_json::from_str::<PressureStats>(&text).unwrap()
    };
    assert_eq!(
        statuses(&client, &format!("http://{addr}/work"), None, 1).await,
        [200]
    );
    let up = stats().await;
    assert!(!up.backend.down && up.backend.handled_errors == 0);

    redis.kill();
    let got = statuses(&client, &format!("http://{addr}/work"), None, 3).await;
    assert_eq!(got, [200; 3], "fail-open answers");
    let down = stats().await;
    assert!(down.backend.down, "{:?}", down.backend);
    assert!(down.backend.outages >= 1 && down.backend.handled_errors >= 3);
    assert_eq!(
        down.resources["pressure:service:rest"].stats.backend_errors,
        0
    );
}

/// The endpoint serves the queue of a resource: its depth per priority
/// and its busiest flows, by fingerprint only.
#[tokio::test]
async fn stats_endpoint_serves_queue_depth_and_busiest_flows_by_fingerprint() {
    use broker_core::{Cost, Outcome, Priority, RateLimit, ResourceConfig, Target};
    let t = TestBroker::new();
    let limits = Limits::new().rate(RateLimit::per_minute(1));
    t.broker
        .register("llm", ResourceConfig::new(limits))
        .unwrap();
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let broker = t.broker.clone();
        waiting.push(tokio::spawn(async move {
            let target = Target::from("llm")
                .priority(Priority::Batch)
                .flow("tenant-secret-42");
            broker
                .enqueue(target, Cost::default(), |_| async {
                    Outcome::<(), ()>::ok(())
                })
                .await
        }));
    }
    // The first goes at once, the second books the next minute; the rest
    // wait for their turn.
    while t.broker.stats().resources["llm"].queued < 4 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let addr = serve(stats_router(t.broker.clone())).await;
    let text = reqwest::get(format!("http://{addr}{STATS_PATH}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let stats: PressureStats = serde_json::from_str(&text).unwrap();
    let queue = &stats.resources["llm"].stats.queue;
    let batch = queue.levels.iter().find(|l| l.priority == "batch").unwrap();
    assert_eq!(batch.depth, 3, "{text}");
    assert_eq!(queue.busiest_flows.len(), 1);
    assert_eq!(queue.busiest_flows[0].queued, 3);
    assert!(!text.contains("tenant-secret-42"), "{text}");
    assert!(text.contains("\"busiestFlows\""), "{text}");
    for w in waiting {
        w.abort();
    }
}
