//! `maxConcurrentRequests` over a real socket: the slot is held while the
//! body is sent, freed when it ends or when the client aborts mid-body;
//! upgrades and server-sent events hold no slot.

mod common;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use broker_axum::Pressure;
use common::{eventually, serve, statuses, Drip, TestBroker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = r#"{
    "perRoute": [{ "resource": "route:one", "pathPrefix": "/one", "limits": { "maxConcurrentRequests": 1 } }]
}"#;

const RESOURCE: &str = "route:one";

/// A body in one frame, larger than a socket's buffers take.
const BIG: usize = 32 << 20;

fn app(pressure: &Pressure) -> Router {
    Router::new()
        .route("/one/drip", get(|| async { Body::new(Drip::new()) }))
        .route(
            "/one/events",
            get(|| async {
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::new(Drip::new()))
                    .unwrap()
            }),
        )
        .route("/one/small", get(|| async { "small" }))
        .route("/one/big", get(|| async { Bytes::from(vec![b'x'; BIG]) }))
        .route("/one/ws", get(switch_protocols))
        .layer(pressure.layer())
}

/// Answers an upgrade request with 101 and keeps the upgraded connection
/// open (as a WebSocket would) for longer than a test runs.
async fn switch_protocols(mut req: axum::extract::Request) -> Response {
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let _upgraded = upgrade.await;
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    Response::builder()
        .status(101)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .body(Body::empty())
        .unwrap()
}

/// Opens a connection, sends a GET for `path` (with extra header lines),
/// and reads until the first body chunk arrived. Returns the open stream.
async fn start_streaming(addr: std::net::SocketAddr, path: &str, extra: &str) -> TcpStream {
    open(addr, path, extra, "tick", "HTTP/1.1 200").await
}

/// Opens a connection, sends a GET for `path` (with extra header lines),
/// reads until `until` arrived and checks the answer starts with `status`.
/// Returns the open stream.
async fn open(
    addr: std::net::SocketAddr,
    path: &str,
    extra: &str,
    until: &str,
    status: &str,
) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{extra}\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains(until) {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("the server answers")
            .unwrap();
        assert!(
            n > 0,
            "connection closed early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with(status));
    stream
}

/// The statuses of `n` requests, one after another, for the small route.
async fn small(addr: std::net::SocketAddr, n: usize) -> Vec<u16> {
    statuses(
        &reqwest::Client::new(),
        &format!("http://{addr}/one/small"),
        None,
        n,
    )
    .await
}

#[tokio::test]
async fn aborted_response_frees_its_slot() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let small = format!("http://{addr}/one/small");

    let stream = start_streaming(addr, "/one/drip", "").await;
    assert_eq!(
        t.stat(RESOURCE, |s| s.in_flight),
        1,
        "the endless body holds the slot"
    );
    assert_eq!(
        statuses(&client, &small, None, 1).await,
        [429],
        "the only slot is taken"
    );

    // The client goes away mid-body.
    the_slot_comes_free_when_dropped(&t, addr, stream).await;
}

/// Drops `stream`, a response mid-body, and checks that its slot comes
/// free: nothing in flight, and the next request admitted.
async fn the_slot_comes_free_when_dropped(
    t: &TestBroker,
    addr: std::net::SocketAddr,
    stream: TcpStream,
) {
    drop(stream);
    the_slot_comes_free(t, addr, "the dropped body released the slot").await;
}

/// Checks that the slot comes free: nothing in flight, and the next
/// request admitted.
async fn the_slot_comes_free(t: &TestBroker, addr: std::net::SocketAddr, why: &str) {
    assert!(
        eventually(Duration::from_secs(10), || t
            .stat(RESOURCE, |s| s.in_flight)
            == 0)
        .await,
        "{why}"
    );
    assert_eq!(small(addr, 1).await, [200]);
}

/// A body sent for longer than the resource's lease TTL (60 s by
/// default) keeps its slot on the in-memory store: the slot is the
/// response's until its body ends.
#[tokio::test]
async fn a_body_sent_past_the_lease_ttl_keeps_its_slot() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let stream = start_streaming(addr, "/one/drip", "").await;
    t.clock.advance(Duration::from_secs(3600));
    assert_eq!(small(addr, 1).await, [429], "the body still holds the slot");
    the_slot_comes_free_when_dropped(&t, addr, stream).await;
}

/// A large body in one frame holds its slot while it is being sent, not
/// only until the server took the frame in: a client that reads slowly
/// keeps it, and the slot comes free once the body has gone out.
#[tokio::test]
async fn a_large_body_holds_its_slot_until_it_is_sent() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let mut slow = open(addr, "/one/big", "", "\r\n\r\n", "HTTP/1.1 200").await;
    assert_eq!(t.stat(RESOURCE, |s| s.in_flight), 1);
    assert_eq!(small(addr, 1).await, [429], "most of the body is unsent");
    // Reads the body (`open` read the head and at most 1 KiB more): what
    // is left then fits the socket's buffers, so the body goes out, and
    // its slot comes free.
    let mut left = BIG - 1024;
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let n = slow.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed with {left} bytes to come");
        left = left.saturating_sub(n);
    }
    the_slot_comes_free(&t, addr, "the body was sent, its slot freed").await;
}

#[tokio::test]
async fn finished_body_frees_its_slot() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let got = statuses(&client, &format!("http://{addr}/one/small"), None, 5).await;
    assert_eq!(got, [200; 5], "each finished response gave the slot back");
    assert_eq!(t.stat(RESOURCE, |s| s.in_flight), 0);
}

/// The answer to a request while an endless body holds the only slot of
/// `config`'s route.
async fn denied_while_the_slot_is_held(config: &str) -> reqwest::Response {
    let t = TestBroker::new();
    let pressure = t.pressure(config);
    let addr = serve(app(&pressure)).await;
    let _stream = start_streaming(addr, "/one/drip", "").await;
    let res = reqwest::get(format!("http://{addr}/one/small"))
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    res
}

#[tokio::test]
async fn concurrency_denial_says_retry_after_one_second() {
    let res = denied_while_the_slot_is_held(CONFIG).await;
    assert_eq!(res.headers()["retry-after"], "1");
}

#[tokio::test]
async fn event_stream_holds_no_slot() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let _sse = start_streaming(addr, "/one/events", "Accept: text/event-stream\r\n").await;
    assert_eq!(t.stat(RESOURCE, |s| s.in_flight), 0);
    let got = small(addr, 2).await;
    assert_eq!(
        got,
        [200, 200],
        "the open event stream does not block others"
    );
}

#[tokio::test]
async fn an_upgraded_connection_holds_no_slot() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let upgrade = "Connection: upgrade\r\nUpgrade: websocket\r\n";
    let ws = open(addr, "/one/ws", upgrade, "\r\n\r\n", "HTTP/1.1 101").await;
    // The upgraded connection stays open and holds no slot.
    assert_eq!(t.stat(RESOURCE, |s| s.in_flight), 0);
    let got = small(addr, 1).await;
    assert_eq!(got, [200]);
    drop(ws);
}

/// An `Upgrade` field does not buy a request out of the limit: answered
/// as any other request (no protocol switched), it holds its slot to the
/// end of its body.
#[tokio::test]
async fn an_upgrade_field_answered_without_an_upgrade_holds_its_slot() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let upgrade = "Connection: upgrade\r\nUpgrade: websocket\r\n";
    let _stream = start_streaming(addr, "/one/drip", upgrade).await;
    assert_eq!(t.stat(RESOURCE, |s| s.in_flight), 1);
    let got = small(addr, 1).await;
    assert_eq!(got, [429]);
}

/// A concurrency denial on a resource that also has a rate limit does not
/// claim that the rate ran out.
#[tokio::test]
async fn a_concurrency_denial_names_no_exhausted_rate() {
    let res = denied_while_the_slot_is_held(
        r#"{ "perRoute": [{ "resource": "route:one", "pathPrefix": "/one",
             "limits": { "requestsPerMinute": 1000, "maxConcurrentRequests": 1 } }] }"#,
    )
    .await;
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(
        res.headers()["ratelimit-policy"],
        r#""route:one";q=1000;w=60"#
    );
    assert!(res.headers().get("ratelimit").is_none());
}
