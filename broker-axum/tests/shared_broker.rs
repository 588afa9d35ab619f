//! Two configs on one broker: the same ids with the same limits are one
//! limit; other limits under an id already taken are refused, unless the
//! second is a reload, whose limits (and headers) the earlier layers then
//! follow.

mod common;

use axum::routing::get;
use axum::Router;
use broker_axum::{FromHeader, Pressure, PressureConfig};
use broker_core::{Limits, RateLimit, ResourceConfig};
use common::{serve, statuses, TestBroker};
use http::HeaderName;

fn config(json: &str) -> PressureConfig {
    PressureConfig::from_json("test.json", json).expect("valid config")
}

fn app(pressure: &Pressure) -> Router {
    Router::new()
        .route("/x", get(|| async { "x" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
        .layer(pressure.layer())
}

/// Both configs keep the default tenant resource id: the second, with a
/// looser tenant limit, is refused (naming the field), registers nothing,
/// and the first keeps its limit.
#[tokio::test]
async fn other_limits_under_a_taken_id_are_refused() {
    let t = TestBroker::new();
    let first =
        t.pressure(r#"{ "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 2 } } }"#);
    let second = config(
        r#"{ "perRoute": [{ "resource": "route:new", "pathPrefix": "/new", "limits": { "requestsPerSecond": 5 } }],
             "perTenant": { "enabled": true, "limits": { "requestsPerSecond": 1000 } } }"#,
    );
    let e = Pressure::new(t.broker.clone(), &second)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("perTenant.resource") && e.contains("pressure:tenant"),
        "{e}"
    );
    assert!(t.broker.limits("route:new").is_err(), "nothing registered");
    let addr = serve(app(&first)).await;
    let client = reqwest::Client::new();
    let got = statuses(
        &client,
        &format!("http://{addr}/x"),
        Some(("x-tenant", "acme")),
        4,
    )
    .await;
    assert_eq!(got, [200, 200, 429, 429], "the first config's 2 a minute");

    // The application's own resource of that id, a queue, is not taken
    // over either, whatever the limits.
    let limits = Limits::new().rate(RateLimit::per_second(5));
    t.broker
        .register("llm", ResourceConfig::new(limits.clone()))
        .unwrap();
    let over = config(
        r#"{ "perRoute": [{ "resource": "llm", "pathPrefix": "/llm", "limits": { "requestsPerSecond": 5 } }] }"#,
    );
    let e = Pressure::new(t.broker.clone(), &over)
        .unwrap_err()
        .to_string();
    assert!(e.contains("perRoute[0].resource"), "{e}");
    let e = Pressure::reload(t.broker.clone(), &over, None).unwrap_err();
    assert!(e.to_string().contains("queue"), "a reload neither: {e}");
    assert_eq!(
        t.broker.stats().resources["llm"].kind,
        broker_core::ResourceKind::Queue
    );
}

/// The same config twice on one broker: one limit, shared.
#[tokio::test]
async fn the_same_limits_under_one_id_are_one_limit() {
    let t = TestBroker::new();
    let json = r#"{ "perService": { "rest": { "requestsPerMinute": 3 } } }"#;
    let (a, b) = (t.pressure(json), t.pressure(json));
    let (a, b) = (serve(app(&a)).await, serve(app(&b)).await);
    let client = reqwest::Client::new();
    let from_a = statuses(&client, &format!("http://{a}/x"), None, 2).await;
    let from_b = statuses(&client, &format!("http://{b}/x"), None, 2).await;
    assert_eq!((from_a, from_b), (vec![200, 200], vec![200, 429]));
    // A third of the same config keeps the resource as it is: its state
    // (still spent) and its counters.
    let c = serve(app(&t.pressure(json))).await;
    let from_c = statuses(&client, &format!("http://{c}/x"), None, 1).await;
    assert_eq!(from_c, [429]);
    assert_eq!(t.stat("pressure:service:rest", |s| s.allowed), 3);
    assert_eq!(t.stat("pressure:service:rest", |s| s.denied), 2);
}

/// A reload re-configures the ids it shares with an earlier config: the
/// earlier layers decide by the new limits, and their denials' headers say
/// so.
#[tokio::test]
async fn a_reload_is_followed_by_the_earlier_layers_headers_and_all() {
    let t = TestBroker::new();
    let before = t.pressure(r#"{ "perService": { "rest": { "requestsPerSecond": 2 } } }"#);
    let addr = serve(app(&before)).await;
    let after = config(r#"{ "perService": { "rest": { "requestsPerMinute": 1 } } }"#);
    let reloaded = Pressure::reload(t.broker.clone(), &after, None).unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/x");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    let denied = client.get(&url).send().await.unwrap();
    assert_eq!(denied.status(), 429, "1 a minute now");
    let field = |name: &str| denied.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(field("retry-after"), "60");
    assert_eq!(
        field("ratelimit-policy"),
        r#""pressure:service:rest";q=1;w=60"#
    );
    assert_eq!(
        t.broker
            .limits("pressure:service:rest")
            .unwrap()
            .rates
            .len(),
        1
    );
    drop(reloaded);
}
