//! Two server instances on one Redis enforce one shared limit (a real
//! redis-server started by the test on a free loopback port).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use broker_axum::{FromHeader, Pressure, PressureConfig};
use broker_core::{Clock, ManualClock, ResourceBroker};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;
use common::serve;
use http::HeaderName;

const CONFIG: &str = r#"{
    "perRoute": [{ "resource": "route:hooks", "pathPrefix": "/hooks", "limits": { "requestsPerMinute": 4 } }],
    "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 2 } }
}"#;

/// One server instance: its own broker and Redis connection.
async fn instance(url: &str, clock: &ManualClock) -> SocketAddr {
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let backend = RedisBackend::builder(url)
        .client_time(shared)
        .connect()
        .await
        .expect("connects to the test redis");
    let config = PressureConfig::from_json("t.json", CONFIG).unwrap();
    let pressure = Pressure::new(ResourceBroker::new(backend), &config).unwrap();
    let app = Router::new()
        .route("/hooks/{name}", post(|| async { "queued" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
        .layer(pressure.layer());
    serve(app).await
}

async fn post_n(client: &reqwest::Client, url: &str, tenant: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let res = client
            .post(url)
            .header("x-tenant", tenant)
            .send()
            .await
            .unwrap();
        out.push(res.status().as_u16());
    }
    out
}

/// Two instances on `redis` sharing one manual clock, set to 1,000 s:
/// the clock and the instances' addresses.
async fn two_instances(redis: &RedisServer) -> (ManualClock, SocketAddr, SocketAddr) {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let a = instance(&redis.url(), &clock).await;
    let b = instance(&redis.url(), &clock).await;
    (clock, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_enforce_one_shared_limit() {
    let redis = RedisServer::start();
    let (clock, a, b) = two_instances(&redis).await;
    let client = reqwest::Client::new();

    // Route limit 4/min shared by both instances; tenants 2/min each.
    assert_eq!(
        post_n(&client, &format!("http://{a}/hooks/x"), "t1", 2).await,
        [200, 200]
    );
    assert_eq!(
        post_n(&client, &format!("http://{b}/hooks/x"), "t1", 1).await,
        [429],
        "t1's tenant quota is shared across instances"
    );
    assert_eq!(
        post_n(&client, &format!("http://{b}/hooks/x"), "t2", 2).await,
        [200, 200]
    );
    let res = client
        .post(format!("http://{a}/hooks/x"))
        .header("x-tenant", "t3")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        429,
        "4 of 4 route requests used across both instances"
    );
    assert_eq!(
        res.headers()["retry-after"],
        "15",
        "4/min: a token every 15 s"
    );

    clock.advance(Duration::from_secs(15));
    assert_eq!(
        post_n(&client, &format!("http://{b}/hooks/x"), "t3", 2).await,
        [200, 429]
    );
}

/// At a concurrency limit of 1 on Redis, a client that sends its requests
/// one after another on one keep-alive connection is never denied: each
/// response's slot is free again before the next request is decided. The
/// order is what is checked, not the speed: a reply late by more than the
/// default response timeout (1 s) on a stalled machine would start an
/// outage and deny a request fail-closed, so the timeout is 30 s here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_after_another_at_a_concurrency_of_one_is_never_denied() {
    let redis = RedisServer::start();
    let backend = RedisBackend::builder(&redis.url())
        .response_timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let config = PressureConfig::from_json(
        "t.json",
        r#"{ "perService": { "rest": { "maxConcurrentRequests": 1 } } }"#,
    )
    .unwrap();
    let pressure = Pressure::new(ResourceBroker::new(backend), &config).unwrap();
    let app = Router::new()
        .route("/hooks/{name}", post(|| async { "queued" }))
        .layer(pressure.layer());
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/hooks/a");
    let mut denied = Vec::new();
    for i in 0..200 {
        let status = client.post(&url).send().await.unwrap().status();
        if status != 200 {
            denied.push((i, status.as_u16()));
        }
    }
    assert!(denied.is_empty(), "denied: {denied:?}");
}

/// Redis down, the local fallback answering: a tenant's refused flood still
/// gives the route's cost back, there (where the admissions were charged),
/// so another tenant is not denied by the route limit the flood used up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_tenant_flood_is_refunded_where_the_fallback_charged_it() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let backend = RedisBackend::builder(&redis.url())
        .client_time(Arc::new(clock.clone()))
        .connect_with_policy(broker_core::FailurePolicy::local_fallback(
            1.0,
            broker_memory::MemoryBackend::with_clock(clock),
        ))
        .await
        .unwrap();
    let config = PressureConfig::from_json(
        "t.json",
        r#"{
        "perRoute": [{ "resource": "route:hooks", "pathPrefix": "/hooks", "limits": { "requestsPerMinute": 5 } }],
        "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } }
    }"#,
    )
    .unwrap();
    let broker = ResourceBroker::new(backend);
    let pressure = Pressure::new(broker.clone(), &config).unwrap();
    let app = Router::new()
        .route("/hooks/{name}", post(|| async { "queued" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
        .layer(pressure.layer());
    let addr = serve(app).await;
    redis.kill();
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/hooks/a");
    let flood = post_n(&client, &url, "flooder", 8).await;
    assert_eq!(flood[0], 200);
    assert!(flood[1..].iter().all(|&s| s == 429), "{flood:?}");
    assert!(broker.stats().backend.down, "the fallback answered");
    assert_eq!(
        post_n(&client, &url, "other", 1).await,
        [200],
        "the route's 5/min were given back"
    );
}

/// Every key of the Redis server at `url` (`SCAN` to the end).
async fn all_keys(url: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await
            .unwrap();
        keys.extend(
            batch
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
        );
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// An app that keys tenants by API key: the key reaches no Redis key, not
/// even when it is short and plain; its tenant's state is there under
/// its fingerprint. Before, the key was `…:sk_live_4eC39…}:b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_tenant_reaches_no_redis_key() {
    const API_KEY: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
    let redis = RedisServer::start();
    let (_clock, a, b) = two_instances(&redis).await;
    let client = reqwest::Client::new();
    let statuses = [
        post_n(&client, &format!("http://{a}/hooks/x"), API_KEY, 2).await,
        post_n(&client, &format!("http://{b}/hooks/x"), API_KEY, 1).await,
    ];
    assert_eq!(statuses, [vec![200, 200], vec![429]], "one shared quota");
    let keys = all_keys(&redis.url()).await;
    let tenant_keys: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains("pressure%3Atenant"))
        .collect();
    assert!(!tenant_keys.is_empty(), "the tenant's state: {keys:?}");
    for key in &keys {
        assert!(!key.contains("sk_live"), "the API key in {key:?}");
    }
    // Under its fingerprint, the same in every replica.
    let config = PressureConfig::from_json("t.json", CONFIG).unwrap();
    let local = ResourceBroker::new(broker_memory::MemoryBackend::new());
    let fingerprint = Pressure::new(local, &config).unwrap().tenant_key(API_KEY);
    assert!(
        tenant_keys.iter().any(|k| k.contains(&fingerprint)),
        "{fingerprint} in {tenant_keys:?}"
    );
}
