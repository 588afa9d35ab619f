//! The route/service stage over a real socket: which limit applies, what a
//! denial says, what a backend failure answers.

mod common;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use broker_axum::{Pressure, PressureConfig, Responses};
use broker_core::ResourceBroker;
use common::{count, get_line, raw_status, serve, statuses, TestBroker};

fn app(pressure: &Pressure) -> Router {
    Router::new()
        .route("/hooks/{name}", get(|| async { "hook" }))
        .route("/other", get(|| async { "other" }))
        .layer(pressure.layer())
}

/// A GET that answers with its `{name}` path parameter, decoded.
fn echo_name() -> axum::routing::MethodRouter {
    get(|axum::extract::Path(name): axum::extract::Path<String>| async move { name })
}

/// A server of `/files/{*path}` behind `pressure`, answering with the
/// path its handler got (decoded, `%2F` a `/`).
async fn serve_files(pressure: &Pressure) -> std::net::SocketAddr {
    let path = |axum::extract::Path(path): axum::extract::Path<String>| async move { path };
    let app = Router::new()
        .route("/files/{*path}", get(path))
        .layer(pressure.layer());
    serve(app).await
}

#[tokio::test]
async fn route_override_beats_service_limit() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{
        "perService": { "rest": { "requestsPerMinute": 3 } },
        "perRoute": [{ "resource": "route:hooks", "pathPrefix": "/hooks", "limits": { "requestsPerMinute": 1 } }]
    }"#,
    );
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();

    let hooks = statuses(&client, &format!("http://{addr}/hooks/a"), None, 2).await;
    assert_eq!(hooks, [200, 429], "the route's own limit (1/min) applies");
    let other = statuses(&client, &format!("http://{addr}/other"), None, 4).await;
    assert_eq!(
        other,
        [200, 200, 200, 429],
        "route requests did not use the service limit (3/min)"
    );
    assert_eq!(t.stat("route:hooks", |s| s.allowed), 1);
    assert_eq!(t.stat("route:hooks", |s| s.denied), 1);
    assert_eq!(t.stat("pressure:service:rest", |s| s.allowed), 3);
    assert_eq!(t.stat("pressure:service:rest", |s| s.denied), 1);
}

/// A letter written percent-encoded reaches the same handler (the router
/// decodes the path parameter), so it meets the same route limit: the
/// route is chosen on the path with its percent-encodings decoded.
#[tokio::test]
async fn a_percent_encoded_letter_meets_the_same_route_limit() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:stripe", "pathPrefix": "/hooks/stripe", "limits": { "requestsPerMinute": 2 } }
        ] }"#,
    );
    let app = Router::new()
        .route("/hooks/{name}", echo_name())
        .layer(pressure.layer());
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let plain = client
        .get(format!("http://{addr}/hooks/stripe"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 200);
    let encoded = client
        .get(format!("http://{addr}/hooks/%73tri%70e"))
        .send()
        .await
        .unwrap();
    assert_eq!(encoded.status(), 200);
    assert_eq!(encoded.text().await.unwrap(), "stripe", "the same handler");
    let again = statuses(&client, &format!("http://{addr}/hooks/%73tripe"), None, 1).await;
    assert_eq!(again, [429], "the route's 2/min are used");
    assert_eq!(t.stat("route:stripe", |s| s.allowed), 2);
}

/// Every spelling of a path meets the limit of its prefix: a reserved
/// character percent-encoded, a non-ASCII one sent raw or encoded, and
/// characters hyper takes raw that a prefix may hold encoded. Sent as raw
/// request lines, which a client library would re-encode.
#[tokio::test]
async fn every_spelling_of_a_path_meets_the_same_route_limit() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:me", "pathPrefix": "/users/@me", "limits": { "requestsPerMinute": 1 } },
            { "resource": "route:cafe", "pathPrefix": "/hooks/caf%C3%A9", "limits": { "requestsPerMinute": 1 } },
            { "resource": "route:raw", "pathPrefix": "/q/%7Bx%7D", "limits": { "requestsPerMinute": 1 } }
        ] }"#,
    );
    let app = Router::new()
        .route("/users/{name}", echo_name())
        .route("/hooks/{name}", echo_name())
        .route("/q/{name}", echo_name())
        .layer(pressure.layer());
    let addr = serve(app).await;
    for (first, second, resource) in [
        (&b"/users/@me"[..], &b"/users/%40me"[..], "route:me"),
        (
            "/hooks/caf\u{e9}".as_bytes(),
            &b"/hooks/caf%c3%a9"[..],
            "route:cafe",
        ),
        (&b"/q/%7Bx%7D"[..], &b"/q/{x}"[..], "route:raw"),
    ] {
        let what = String::from_utf8_lossy(second).into_owned();
        assert_eq!(raw_status(addr, &get_line(first)).await, 200, "{what}");
        assert_eq!(raw_status(addr, &get_line(second)).await, 429, "{what}");
        assert_eq!(t.stat(resource, |s| s.allowed), 1, "{what}");
        assert_eq!(t.stat(resource, |s| s.denied), 1, "{what}");
    }
}

/// A `/` sent as `%2F` is inside a segment, as the router takes it: the
/// request meets the limit of the shorter prefix whose handler serves it,
/// not a longer prefix's (looser) one.
#[tokio::test]
async fn an_encoded_slash_does_not_reach_a_longer_prefixs_limit() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:files", "pathPrefix": "/files", "limits": { "requestsPerMinute": 1 } },
            { "resource": "route:public", "pathPrefix": "/files/public", "limits": { "requestsPerMinute": 1000 } }
        ] }"#,
    );
    let app = Router::new()
        .route("/files/{name}", echo_name())
        .route("/files/public/{*rest}", get(|| async { "public" }))
        .layer(pressure.layer());
    let addr = serve(app).await;
    assert_eq!(raw_status(addr, &get_line(b"/files/secret")).await, 200);
    assert_eq!(
        raw_status(addr, &get_line(b"/files/public%2Fanything")).await,
        429
    );
    assert_eq!(
        raw_status(addr, &get_line(b"/files/public/anything")).await,
        200
    );
    assert_eq!(t.stat("route:files", |s| s.denied), 1);
    assert_eq!(t.stat("route:public", |s| s.allowed), 1);
}

/// A wildcard route hands its handler a `%2F` as a `/`: such a path also
/// meets the limit of the deeper prefix it then reads as, and a denial
/// there gives back what the router's reading (the shorter prefix) took.
#[tokio::test]
async fn an_encoded_slash_under_a_wildcard_meets_the_deeper_prefixs_limit() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:files", "pathPrefix": "/files", "limits": { "requestsPerMinute": 2 } },
            { "resource": "route:private", "pathPrefix": "/files/private", "limits": { "requestsPerMinute": 1 } }
        ] }"#,
    );
    let addr = serve_files(&pressure).await;
    assert_eq!(raw_status(addr, &get_line(b"/files/private/a")).await, 200);
    for spelling in [
        &b"/files/private%2Fb"[..],
        b"/files/private%2fb",
        b"/files/%70rivate%2Fb",
    ] {
        let what = String::from_utf8_lossy(spelling).into_owned();
        assert_eq!(raw_status(addr, &get_line(spelling)).await, 429, "{what}");
    }
    assert_eq!(t.stat("route:private", |s| s.allowed), 1);
    assert_eq!(t.stat("route:private", |s| s.denied), 3);
    // Each of the three took from `/files` first, and got it back.
    assert_eq!(raw_status(addr, &get_line(b"/files/x")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/y")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/z")).await, 429);
    // A `%2F` that is not one (`%252F` is the three bytes `%2F`) is the
    // router's reading only.
    assert_eq!(
        raw_status(addr, &get_line(b"/files/private%252Fc")).await,
        429
    );
    assert_eq!(t.stat("route:private", |s| s.denied), 3);
    assert_eq!(t.stat("route:files", |s| s.denied), 2);
}

/// A wildcard route hands its handler `/files/./private/a` as
/// `./private/a` and `/files//private/a` as `/private/a`, which a file
/// server (or any handler that reads its path as a file path) serves as
/// `private/a`: such a path also meets the deeper prefix's limit, as a
/// `%2F` does, and so does one outside every route (here under a service
/// limit) that reads as a limited route's path. A segment that only starts
/// with a dot is a segment like any other.
#[tokio::test]
async fn a_dot_or_empty_segment_does_not_step_around_a_deeper_prefixs_limit() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perService": { "rest": { "requestsPerMinute": 100 } },
             "perRoute": [
            { "resource": "route:files", "pathPrefix": "/files", "limits": { "requestsPerMinute": 100 } },
            { "resource": "route:private", "pathPrefix": "/files/private", "limits": { "requestsPerMinute": 1 } }
        ] }"#,
    );
    let file = |axum::extract::Path(path): axum::extract::Path<String>| async move { path };
    let app = Router::new()
        .route("/files/{*path}", get(file))
        .route("/{*path}", get(file))
        .layer(pressure.layer());
    let addr = serve(app).await;
    assert_eq!(raw_status(addr, &get_line(b"/files/private/a")).await, 200);
    let spellings = [
        &b"/files/./private/a"[..],
        b"/files//private/a",
        b"/files/.//./private/a",
        b"/files/%2E/private/a",
        b"/files/%2e%2Fprivate/a",
        b"/./files/private/a",
        b"//files/private/a",
    ];
    for spelling in spellings {
        let what = String::from_utf8_lossy(spelling).into_owned();
        assert_eq!(raw_status(addr, &get_line(spelling)).await, 429, "{what}");
    }
    assert_eq!(
        t.stat("route:private", |s| s.denied),
        spellings.len() as u64
    );
    // Other paths under dots are limited as they were.
    for other in [
        &b"/files/./public/a"[..],
        b"/files/.private/a",
        b"/files/private./a",
        b"/.well-known/private/a",
    ] {
        let what = String::from_utf8_lossy(other).into_owned();
        assert_eq!(raw_status(addr, &get_line(other)).await, 200, "{what}");
    }
    assert_eq!(t.stat("route:private", |s| s.allowed), 1);
}

/// With no limit for the router's reading at all (no shorter route, no
/// service limit), a `%2F` path does not pass unlimited: it meets the
/// deeper prefix's limit.
#[tokio::test]
async fn an_encoded_slash_does_not_pass_unlimited() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:private", "pathPrefix": "/files/private", "limits": { "requestsPerMinute": 1 } }
        ] }"#,
    );
    let addr = serve_files(&pressure).await;
    assert_eq!(
        raw_status(addr, &get_line(b"/files/private%2Fa")).await,
        200
    );
    assert_eq!(raw_status(addr, &get_line(b"/files/private/b")).await, 429);
    assert_eq!(
        raw_status(addr, &get_line(b"/files/private%2Fc")).await,
        429
    );
    assert_eq!(raw_status(addr, &get_line(b"/files/public%2Fc")).await, 200);
    assert_eq!(t.stat("route:private", |s| s.allowed), 1);
    assert_eq!(t.stat("route:private", |s| s.denied), 2);
}

/// A prefix that spells its `/` as `%2F` limits the paths a wildcard
/// handler reads the same: `/files/a/b/y` reaches `/files/{*path}` as
/// `a/b/y`, as `/files/a%2Fb/y` does, and meets `/files/a%2Fb`'s limit.
#[tokio::test]
async fn a_prefix_with_an_encoded_slash_limits_the_plain_spelling_too() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:files", "pathPrefix": "/files", "limits": { "requestsPerMinute": 100 } },
            { "resource": "route:ab", "pathPrefix": "/files/a%2Fb", "limits": { "requestsPerMinute": 1 } }
        ] }"#,
    );
    let addr = serve_files(&pressure).await;
    assert_eq!(raw_status(addr, &get_line(b"/files/a%2Fb/x")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/a/b/y")).await, 429);
    assert_eq!(raw_status(addr, &get_line(b"/files/a%2Fb/z")).await, 429);
    assert_eq!(t.stat("route:ab", |s| s.denied), 2);
    // Other paths are read as before: `/files` admitted them, and
    // `/files/a/b/y` (given back when `/files/a%2Fb` denied it).
    assert_eq!(raw_status(addr, &get_line(b"/files/a/c")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/ab")).await, 200);
    assert_eq!(t.stat("route:files", |s| s.allowed), 3);
}

/// Two prefixes that read the same to a wildcard handler, one with `/`
/// and one with `%2F`: a path in either spelling meets both limits.
#[tokio::test]
async fn prefixes_that_read_the_same_both_limit_either_spelling() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:plain", "pathPrefix": "/files/a/b", "limits": { "requestsPerMinute": 1 } },
            { "resource": "route:encoded", "pathPrefix": "/files/a%2Fb", "limits": { "requestsPerMinute": 100 } }
        ] }"#,
    );
    let addr = serve_files(&pressure).await;
    assert_eq!(raw_status(addr, &get_line(b"/files/a%2Fb/y")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/a%2Fb/z")).await, 429);
    assert_eq!(raw_status(addr, &get_line(b"/files/a/b/z")).await, 429);
    assert_eq!(t.stat("route:plain", |s| s.allowed), 1);
    assert_eq!(t.stat("route:plain", |s| s.denied), 2);
    // The encoded route was charged by the first, and by the second before
    // the plain one denied it (and got it back).
    assert_eq!(t.stat("route:encoded", |s| s.allowed), 2);
}

/// A request charged on both readings holds a concurrency slot of each
/// until its response ends, and frees both when the client goes away.
#[tokio::test]
async fn an_encoded_slash_holds_the_slots_of_both_readings() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:files", "pathPrefix": "/files", "limits": { "maxConcurrentRequests": 5 } },
            { "resource": "route:private", "pathPrefix": "/files/private", "limits": { "maxConcurrentRequests": 1 } }
        ] }"#,
    );
    let app = Router::new()
        .route(
            "/files/{*path}",
            get(|| async { axum::body::Body::new(common::Drip::new()) }),
        )
        .layer(pressure.layer());
    let addr = serve(app).await;
    let mut held = tokio::net::TcpStream::connect(addr).await.unwrap();
    held.write_all(&get_line(b"/files/private%2Fa"))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = held.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    let in_flight = |id: &str| t.stat(id, |s| s.in_flight);
    assert_eq!(
        (in_flight("route:files"), in_flight("route:private")),
        (1, 1)
    );
    assert_eq!(raw_status(addr, &get_line(b"/files/private/b")).await, 429);
    drop(held);
    let freed = || in_flight("route:files") == 0 && in_flight("route:private") == 0;
    assert!(common::eventually(Duration::from_secs(5), freed).await);
    assert_eq!(raw_status(addr, &get_line(b"/files/private/b")).await, 200);
}

/// `OPTIONS *` and `CONNECT host:port` carry no path: they meet the limit
/// of a route on `/`, as every other request does.
#[tokio::test]
async fn requests_without_a_path_meet_the_route_on_slash() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perRoute": [
            { "resource": "route:all", "pathPrefix": "/", "limits": { "requestsPerMinute": 2 } }
        ] }"#,
    );
    let app = Router::new()
        .fallback(|| async { "any" })
        .layer(pressure.layer());
    let addr = serve(app).await;
    let options = b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let connect =
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nConnection: close\r\n\r\n";
    assert_ne!(raw_status(addr, options).await, 429);
    assert_ne!(raw_status(addr, connect).await, 429);
    assert_eq!(t.stat("route:all", |s| s.allowed), 2, "both were counted");
    assert_eq!(raw_status(addr, options).await, 429);
    assert_eq!(raw_status(addr, connect).await, 429);
    assert_eq!(t.stat("route:all", |s| s.denied), 2);
}

#[tokio::test]
async fn longest_prefix_wins_and_boundaries_are_segments() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{
        "perRoute": [
            { "resource": "route:all", "pathPrefix": "/hooks", "limits": { "requestsPerMinute": 100 } },
            { "resource": "route:stripe", "pathPrefix": "/hooks/stripe", "limits": { "requestsPerMinute": 1 } }
        ]
    }"#,
    );
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let stripe = statuses(&client, &format!("http://{addr}/hooks/stripe"), None, 2).await;
    assert_eq!(stripe, [200, 429]);
    let stripex = statuses(&client, &format!("http://{addr}/hooks/stripex"), None, 2).await;
    assert_eq!(
        stripex,
        [200, 200],
        "/hooks/stripex is not under /hooks/stripe"
    );
    assert_eq!(t.stat("route:all", |s| s.allowed), 2);
    let other = statuses(&client, &format!("http://{addr}/other"), None, 3).await;
    assert_eq!(other, [200, 200, 200], "no service limit configured");
}

#[tokio::test]
async fn retry_after_is_at_least_one_and_matches_the_wait() {
    let t = TestBroker::new();
    let pressure = t.pressure(r#"{ "perService": { "rest": { "requestsPerMinute": 2 } } }"#);
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/other");

    assert_eq!(statuses(&client, &url, None, 2).await, [200, 200]);
    let res = client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 429);
    // Bucket of 2 per minute, empty: the next token is 30 s away.
    assert_eq!(res.headers()["retry-after"], "30");
    assert_eq!(
        res.headers()["ratelimit-policy"],
        r#""pressure:service:rest";q=2;w=60"#
    );
    assert_eq!(
        res.headers()["ratelimit"],
        r#""pressure:service:rest";r=0;t=30"#
    );

    t.clock.advance(Duration::from_millis(29_500));
    let res = client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(
        res.headers()["retry-after"],
        "1",
        "a 0.5 s wait rounds up to 1, never 0"
    );

    t.clock.advance(Duration::from_millis(500));
    assert_eq!(statuses(&client, &url, None, 1).await, [200]);
}

#[tokio::test]
async fn denial_status_body_and_legacy_headers_are_configurable() {
    let t = TestBroker::new();
    let pressure = t
        .pressure(r#"{ "perService": { "rest": { "requestsPerSecond": 1 } } }"#)
        .with_responses(Responses {
            denied_status: http::StatusCode::SERVICE_UNAVAILABLE,
            denied_body: bytes::Bytes::from_static(b"slow down"),
            denied_content_type: http::HeaderValue::from_static("text/plain"),
            legacy_headers: true,
            ..Responses::default()
        });
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/other");
    assert_eq!(statuses(&client, &url, None, 1).await, [200]);
    let res = client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["content-type"], "text/plain");
    assert_eq!(res.headers()["x-ratelimit-limit"], "1");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(res.headers()["x-ratelimit-reset"], "1");
    assert_eq!(res.text().await.unwrap(), "slow down");
}

#[tokio::test]
async fn disabled_config_passes_everything_and_calls_no_broker() {
    let t = TestBroker::new();
    let pressure =
        t.pressure(r#"{ "enabled": false, "perService": { "rest": { "requestsPerMinute": 1 } } }"#);
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let got = statuses(&client, &format!("http://{addr}/other"), None, 5).await;
    assert_eq!(count(&got, 200), 5);
    assert_eq!(t.stat("pressure:service:rest", |s| s.allowed), 0);
}

fn down_pressure() -> Pressure {
    let config = PressureConfig::from_json(
        "t",
        r#"{ "perService": { "rest": { "requestsPerSecond": 5 } } }"#,
    )
    .unwrap();
    Pressure::new(
        ResourceBroker::new(broker_testkit::DownBackend::new("connection refused")),
        &config,
    )
    .unwrap()
}

#[tokio::test]
async fn backend_failure_answers_503_with_retry_after_not_500() {
    let pressure = down_pressure();
    let addr = serve(app(&pressure)).await;
    let res = reqwest::get(format!("http://{addr}/other")).await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    let stats = pressure.broker().stats();
    assert_eq!(stats.resources["pressure:service:rest"].backend_errors, 1);
}

#[tokio::test]
async fn backend_failure_status_is_configurable() {
    let pressure = down_pressure().with_responses(Responses {
        backend_error_status: http::StatusCode::BAD_GATEWAY,
        backend_error_retry_after: Duration::from_millis(2_500),
        ..Responses::default()
    });
    let addr = serve(app(&pressure)).await;
    let res = reqwest::get(format!("http://{addr}/other")).await.unwrap();
    assert_eq!(res.status(), 502);
    assert_eq!(res.headers()["retry-after"], "3");
}
