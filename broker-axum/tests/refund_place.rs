//! Refunds of the route stage go where its cost was charged, in the store
//! or in this process's fallback, whatever the store's health is by the
//! time they are made: the refund of a path read two ways (an encoded
//! `/`, see `route_limits.rs`) whose second reading denies or fails, and
//! the refund a tenant denial makes.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::routing::get;
use axum::Router;
use broker_axum::{FromHeader, Pressure, PressureConfig};
use broker_core::state::{Decision, Marks};
use broker_core::{BackendError, BackendHealth, ResourceBroker};
use broker_memory::MemoryBackend;
use broker_testkit::{Hooks, Wrapped};
use common::{get_line, raw_status, serve};
use http::HeaderName;

/// Over the in-memory store, answered asynchronously: its calls on the
/// `private` route and on the tenant stage fail on demand; while `open`, its calls are answered
/// as a failure policy answers them (let through, marked answered here);
/// its next call on a key holding `flip_on` changes the health it reports
/// (as the probe that finds a shared store back, which the store then
/// answers, or another call finding it gone meanwhile), and each settle is
/// recorded.
#[derive(Default)]
struct Flaky {
    fail_private: AtomicBool,
    fail_tenant: AtomicBool,
    open: AtomicBool,
    flip_on: Mutex<Option<&'static str>>,
    down: AtomicBool,
    settles: Mutex<Vec<(String, Option<Marks>)>>,
    // While set, a settle takes 300 ms to reach the store; `settling` is
    // set once one has set out.
    slow_settles: AtomicBool,
    settling: AtomicBool,
    // While set, a decision on the `private` route takes 300 ms to reach
    // the store; `trying_private` is set once one has set out.
    slow_private_tries: AtomicBool,
    trying_private: AtomicBool,
    // While set, a decision on the tenant stage takes 300 ms to reach the
    // store; `trying_tenant` is set once one has set out.
    slow_tenant_tries: AtomicBool,
    trying_tenant: AtomicBool,
}

impl Hooks for Flaky {
    fn asynchronous(&self) -> bool {
        true
    }
    fn local_states(
        &self,
        _: Arc<dyn broker_core::LocalStates>,
    ) -> Option<Arc<dyn broker_core::LocalStates>> {
        None
    }
    fn try_acquire(&self, key: &str) -> Option<Result<Decision, BackendError>> {
        if key.contains("private") && self.fail_private.load(Ordering::SeqCst)
            || key.contains("tenant") && self.fail_tenant.load(Ordering::SeqCst)
        {
            return Some(Err(BackendError::new("store unreachable")));
        }
        let mut flip_on = self.flip_on.lock().unwrap();
        if flip_on.is_some_and(|on| key.contains(on)) {
            *flip_on = None;
            if self.down.fetch_xor(true, Ordering::SeqCst) {
                // Found back: the store answers from now on.
                self.open.store(false, Ordering::SeqCst);
            }
        }
        self.open
            .load(Ordering::SeqCst)
            .then(|| Ok(Decision::allow(None).by_failure_policy()))
    }
    fn try_acquire_delay(&self, key: &str) -> std::time::Duration {
        let (slow, trying) = match key {
            k if k.contains("private") => (&self.slow_private_tries, &self.trying_private),
            k if k.contains("tenant") => (&self.slow_tenant_tries, &self.trying_tenant),
            _ => return std::time::Duration::ZERO,
        };
        if !slow.load(Ordering::SeqCst) {
            return std::time::Duration::ZERO;
        }
        trying.store(true, Ordering::SeqCst);
        std::time::Duration::from_millis(300)
    }
    fn settle(&self, key: &str, since: Option<Marks>) -> Option<Result<(), BackendError>> {
        self.settles.lock().unwrap().push((key.to_owned(), since));
        None
    }
    fn correction_delay(&self) -> std::time::Duration {
        if !self.slow_settles.load(Ordering::SeqCst) {
            return std::time::Duration::ZERO;
        }
        self.settling.store(true, Ordering::SeqCst);
        std::time::Duration::from_millis(300)
    }
    fn health(&self, inner: BackendHealth) -> BackendHealth {
        BackendHealth {
            down: self.down.load(Ordering::SeqCst),
            ..inner
        }
    }
}

const CONFIG: &str = r#"{ "perRoute": [
    { "resource": "route:files", "pathPrefix": "/files", "limits": { "requestsPerMinute": 2, "maxConcurrentRequests": 1 } },
    { "resource": "route:private", "pathPrefix": "/files/private", "limits": { "requestsPerMinute": 1 } }
],
  "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } } }"#;

/// The stages of `CONFIG` over a [`Flaky`] store, the tenant named by the
/// `x-tenant` field.
async fn serve_flaky() -> (Arc<Wrapped<Flaky>>, ResourceBroker, std::net::SocketAddr) {
    let flaky = Arc::new(Wrapped::new(
        Arc::new(MemoryBackend::new()),
        Flaky::default(),
    ));
    let broker = ResourceBroker::from_arc(flaky.clone());
    let config = PressureConfig::from_json("t.json", CONFIG).unwrap();
    let pressure = Pressure::new(broker.clone(), &config).unwrap();
    let tenant = FromHeader::new(HeaderName::from_static("x-tenant"));
    let app = Router::new()
        .route("/files/{*path}", get(|| async { "file" }))
        .layer(pressure.tenant_layer(tenant))
        .layer(pressure.layer());
    (flaky, broker, serve(app).await)
}

/// A GET of `path` by `tenant`, with `Connection: close`.
fn get_as(tenant: &str, path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nx-tenant: {tenant}\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

/// The store fails on the second reading: the backend-error answer, and
/// the first reading's rate and slot given back.
#[tokio::test]
async fn a_failure_on_the_second_reading_gives_the_first_its_cost_back() {
    let (flaky, broker, addr) = serve_flaky().await;
    flaky.hooks.fail_private.store(true, Ordering::SeqCst);
    assert_eq!(
        raw_status(addr, &get_line(b"/files/private%2Fx")).await,
        503
    );
    assert_eq!(broker.stats().resources["route:files"].in_flight, 0);
    assert_eq!(raw_status(addr, &get_line(b"/files/a")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/b")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/c")).await, 429);
}

/// The store is reached for the first reading, then found gone by the
/// second: the first's cost goes back to the store, not to this process's
/// fallback, which never took it.
#[tokio::test]
async fn a_refund_goes_to_the_store_that_charged_it() {
    let (flaky, _broker, addr) = serve_flaky().await;
    assert_eq!(raw_status(addr, &get_line(b"/files/private/a")).await, 200);
    *flaky.hooks.flip_on.lock().unwrap() = Some("private");
    assert_eq!(
        raw_status(addr, &get_line(b"/files/private%2Fb")).await,
        429
    );
    let settles = flaky.hooks.settles.lock().unwrap().clone();
    assert_eq!(settles, [("route%3Afiles".to_owned(), None)]);
}

/// The store answers the first reading, and another call finds the
/// store gone meanwhile: the first's cost still goes back to the store,
/// which took it (the answer says where it was made; the store's health
/// by the time it is read does not).
#[tokio::test]
async fn a_refund_goes_to_the_store_though_an_outage_is_found_meanwhile() {
    let (flaky, _broker, addr) = serve_flaky().await;
    assert_eq!(raw_status(addr, &get_line(b"/files/private/a")).await, 200);
    *flaky.hooks.flip_on.lock().unwrap() = Some("files");
    assert_eq!(
        raw_status(addr, &get_line(b"/files/private%2Fb")).await,
        429
    );
    assert!(
        flaky.hooks.down.load(Ordering::SeqCst),
        "found gone meanwhile"
    );
    let settles = flaky.hooks.settles.lock().unwrap().clone();
    assert_eq!(settles, [("route%3Afiles".to_owned(), None)]);
}

/// The first reading is answered by the failure policy (the store is
/// down), and the second is the call that finds it back: the first's cost
/// goes back where the failure policy took it, not to the store.
#[tokio::test]
async fn a_refund_of_a_fallback_answer_stays_here() {
    let (flaky, _broker, addr) = serve_flaky().await;
    assert_eq!(raw_status(addr, &get_line(b"/files/private/a")).await, 200);
    flaky.hooks.down.store(true, Ordering::SeqCst);
    flaky.hooks.open.store(true, Ordering::SeqCst);
    *flaky.hooks.flip_on.lock().unwrap() = Some("private");
    assert_eq!(
        raw_status(addr, &get_line(b"/files/private%2Fc")).await,
        429
    );
    let settles = flaky.hooks.settles.lock().unwrap().clone();
    assert_eq!(
        settles,
        [("route%3Afiles".to_owned(), Some(Marks::ANSWERED_HERE))]
    );
}

/// A tenant denial's refund of the route stage, when the route stage was
/// answered by the failure policy and the tenant stage's call is the one
/// that finds the store back: the cost goes back where it was taken.
#[tokio::test]
async fn a_tenant_denial_refunds_where_the_route_stage_was_answered() {
    let (flaky, _broker, addr) = serve_flaky().await;
    assert_eq!(raw_status(addr, &get_as("a", "/files/x")).await, 200);
    flaky.hooks.down.store(true, Ordering::SeqCst);
    flaky.hooks.open.store(true, Ordering::SeqCst);
    *flaky.hooks.flip_on.lock().unwrap() = Some("tenant");
    assert_eq!(raw_status(addr, &get_as("a", "/files/y")).await, 429);
    assert!(
        !flaky.hooks.down.load(Ordering::SeqCst),
        "the tenant call found it back"
    );
    let settles = flaky.hooks.settles.lock().unwrap().clone();
    assert_eq!(
        settles,
        [("route%3Afiles".to_owned(), Some(Marks::ANSWERED_HERE))]
    );
}

/// The store fails on the tenant stage's call (after the route stage was
/// charged): the backend-error answer, and the route stage's cost given
/// back there, as a denial by the tenant stage gives it back, so requests
/// the tenant stage let go no further do not use up the shared limit.
#[tokio::test]
async fn a_tenant_stage_failure_gives_the_route_stage_its_cost_back() {
    let (flaky, broker, addr) = serve_flaky().await;
    flaky.hooks.fail_tenant.store(true, Ordering::SeqCst);
    for tenant in ["a", "b"] {
        assert_eq!(raw_status(addr, &get_as(tenant, "/files/x")).await, 503);
    }
    let settles = flaky.hooks.settles.lock().unwrap().clone();
    let refund = ("route%3Afiles".to_owned(), None);
    assert_eq!(settles, [refund.clone(), refund]);
    assert_eq!(broker.stats().resources["route:files"].in_flight, 0);
    flaky.hooks.fail_tenant.store(false, Ordering::SeqCst);
    assert_eq!(raw_status(addr, &get_as("c", "/files/y")).await, 200);
    assert_eq!(raw_status(addr, &get_as("d", "/files/z")).await, 200);
    assert_eq!(raw_status(addr, &get_as("e", "/files/w")).await, 429);
}

/// Sends `request` to `addr` and leaves (closes the connection) once
/// `set_out` is set: while the server is on its way to its store.
async fn leave_once(addr: std::net::SocketAddr, request: &[u8], set_out: &AtomicBool) {
    use tokio::io::AsyncWriteExt;
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    client.write_all(request).await.unwrap();
    while !set_out.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The settles `flaky` recorded, by key, once there are `n` of them (or
/// after 2 s).
async fn settles_once(flaky: &Wrapped<Flaky>, n: usize) -> Vec<(String, Option<Marks>)> {
    for _ in 0..200 {
        if flaky.hooks.settles.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let mut settles = flaky.hooks.settles.lock().unwrap().clone();
    settles.sort_by(|a, b| a.0.cmp(&b.0));
    settles
}

/// A client that leaves while the refund of its tenant denial is on its
/// way to the store does not cut the refund off: the route stage still
/// gets its cost back. Before, the refund went with the response future
/// that the leaving client's connection dropped.
#[tokio::test]
async fn a_refund_outlives_a_client_that_leaves_meanwhile() {
    let (flaky, broker, addr) = serve_flaky().await;
    assert_eq!(raw_status(addr, &get_as("a", "/files/x")).await, 200);
    flaky.hooks.slow_settles.store(true, Ordering::SeqCst);
    leave_once(addr, &get_as("a", "/files/y"), &flaky.hooks.settling).await;
    let settles = settles_once(&flaky, 1).await;
    assert_eq!(settles, [("route%3Afiles".to_owned(), None)]);
    assert_eq!(broker.stats().resources["route:files"].in_flight, 0);
}

/// A client that leaves while the refund of a path read two ways, whose
/// second reading denied, is on its way to the store does not cut the
/// refund off: the first reading's route still gets its cost back, as it
/// does after a tenant denial. Before, that refund was made inside the
/// admission, and went with the response future the leaving client's
/// connection dropped: the route kept a cost for a request it never
/// served.
#[tokio::test]
async fn a_second_readings_refund_outlives_a_client_that_leaves_meanwhile() {
    let (flaky, broker, addr) = serve_flaky().await;
    // Spends `private`'s one call a minute; `files` is not charged.
    assert_eq!(raw_status(addr, &get_line(b"/files/private/a")).await, 200);
    flaky.hooks.slow_settles.store(true, Ordering::SeqCst);
    let path = get_line(b"/files/private%2Fb");
    leave_once(addr, &path, &flaky.hooks.settling).await;
    let settles = settles_once(&flaky, 1).await;
    assert_eq!(settles, [("route%3Afiles".to_owned(), None)]);
    assert_eq!(broker.stats().resources["route:files"].in_flight, 0);
}

/// A client that leaves while the second reading of a path read two ways
/// is on its way to the store does not leave the first reading's cost
/// charged: the request never reached its handler, as with a client that
/// leaves while a one-stage admission is in flight. Before, the first
/// reading's route kept its cost.
#[tokio::test]
async fn a_client_that_leaves_before_the_second_reading_answers_costs_the_first_nothing() {
    let (flaky, broker, addr) = serve_flaky().await;
    flaky.hooks.slow_private_tries.store(true, Ordering::SeqCst);
    let path = get_line(b"/files/private%2Fb");
    leave_once(addr, &path, &flaky.hooks.trying_private).await;
    let settles = settles_once(&flaky, 2).await;
    let refunded = |key: &str| (key.to_owned(), None);
    assert_eq!(
        settles,
        [refunded("route%3Afiles"), refunded("route%3Aprivate")],
        "both readings' costs given back"
    );
    assert_eq!(broker.stats().resources["route:files"].in_flight, 0);
    flaky
        .hooks
        .slow_private_tries
        .store(false, Ordering::SeqCst);
    assert_eq!(raw_status(addr, &get_line(b"/files/a")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/b")).await, 200);
}

/// A client that leaves while the tenant stage's decision is on its way to
/// the store does not leave the route stage's cost charged: the request
/// never reached its handler, as with a client that leaves while the
/// second reading of a path read two ways is in flight (the tenant
/// stage's own cost goes back too). Before, the route kept a cost for a
/// request it never served.
#[tokio::test]
async fn a_client_that_leaves_before_the_tenant_stage_answers_costs_the_route_nothing() {
    let (flaky, broker, addr) = serve_flaky().await;
    flaky.hooks.slow_tenant_tries.store(true, Ordering::SeqCst);
    leave_once(addr, &get_as("a", "/files/x"), &flaky.hooks.trying_tenant).await;
    let settles = settles_once(&flaky, 2).await;
    assert_eq!(broker.stats().resources["route:files"].in_flight, 0);
    let keys: Vec<_> = settles.iter().map(|(k, m)| (k.as_str(), *m)).collect();
    assert!(
        keys.contains(&("route%3Afiles", None)),
        "the route's cost given back: {keys:?}"
    );
    flaky.hooks.slow_tenant_tries.store(false, Ordering::SeqCst);
    assert_eq!(raw_status(addr, &get_as("b", "/files/a")).await, 200);
    assert_eq!(raw_status(addr, &get_as("c", "/files/b")).await, 200);
    assert_eq!(raw_status(addr, &get_as("d", "/files/c")).await, 429);
}

/// The stages of `CONFIG` over a [`Flaky`] store, whose `/files` handler
/// asks the tenant stage of the same [`Pressure`] again for a part of its
/// work (a nested service behind that stage alone), once it has set
/// `reached`.
async fn serve_nested(reached: Arc<AtomicBool>) -> (Arc<Wrapped<Flaky>>, std::net::SocketAddr) {
    serve_nested_with(reached, true).await
}

/// [`serve_nested`], with a tenant stage of the request's own around its
/// handler (`own_tenant_stage`) or only the route stage.
async fn serve_nested_with(
    reached: Arc<AtomicBool>,
    own_tenant_stage: bool,
) -> (Arc<Wrapped<Flaky>>, std::net::SocketAddr) {
    use tower::ServiceExt;
    let flaky = Arc::new(Wrapped::new(
        Arc::new(MemoryBackend::new()),
        Flaky::default(),
    ));
    let broker = ResourceBroker::from_arc(flaky.clone());
    let config = PressureConfig::from_json("t.json", CONFIG).unwrap();
    let pressure = Pressure::new(broker, &config).unwrap();
    let tenant = || FromHeader::new(HeaderName::from_static("x-tenant"));
    let parts = Router::new()
        .route("/part", get(|| async { "part" }))
        .layer(pressure.tenant_layer(tenant()));
    let handler = move || {
        let (parts, reached) = (parts.clone(), reached.clone());
        async move {
            reached.store(true, Ordering::SeqCst);
            let part = http::Request::get("/part")
                .header("x-tenant", "parts")
                .body(axum::body::Body::empty())
                .unwrap();
            let _ = parts.oneshot(part).await;
            "file"
        }
    };
    let app = Router::new().route("/files/{*path}", get(handler));
    let app = match own_tenant_stage {
        true => app.layer(pressure.tenant_layer(tenant())),
        false => app,
    };
    let app = app.layer(pressure.layer());
    (flaky, serve(app).await)
}

/// A client that leaves while its request's handler waits for a tenant
/// stage of the same policy further in (a nested call) does not get the
/// route stage's cost back: the request reached its handler, and only its
/// own tenant stage, in flight, means it did not. Before, the nested
/// decision in flight was taken for the request's own, and the route
/// served a request it no longer counted.
#[tokio::test]
async fn a_client_that_leaves_after_its_handler_began_keeps_the_route_charged() {
    let reached = Arc::new(AtomicBool::new(false));
    let (flaky, addr) = serve_nested(reached.clone()).await;
    flaky.hooks.slow_tenant_tries.store(true, Ordering::SeqCst);
    leave_once(addr, &get_as("a", "/files/x"), &reached).await;
    // The nested decision, given back once it is answered (300 ms on).
    let settles = settles_once(&flaky, 1).await;
    assert!(
        settles.iter().all(|(k, _)| !k.starts_with("route")),
        "the route's cost kept: {settles:?}"
    );
    flaky.hooks.slow_tenant_tries.store(false, Ordering::SeqCst);
    assert_eq!(raw_status(addr, &get_as("b", "/files/a")).await, 200);
    assert_eq!(raw_status(addr, &get_as("c", "/files/b")).await, 429);
}

/// The same with no tenant stage of the request's own: the nested
/// decision in flight, dropped as the client leaves, is not the
/// request's, which reached its handler, and the route stage keeps its
/// cost. Before, the route stage took it for its own request's tenant
/// stage and gave its cost back.
#[tokio::test]
async fn a_client_that_leaves_a_handler_without_a_tenant_stage_keeps_the_route_charged() {
    let reached = Arc::new(AtomicBool::new(false));
    let (flaky, addr) = serve_nested_with(reached.clone(), false).await;
    flaky.hooks.slow_tenant_tries.store(true, Ordering::SeqCst);
    leave_once(addr, &get_line(b"/files/x"), &reached).await;
    // The nested decision, given back once it is answered (300 ms on).
    let settles = settles_once(&flaky, 1).await;
    assert!(
        settles.iter().all(|(k, _)| !k.starts_with("route")),
        "the route's cost kept: {settles:?}"
    );
    flaky.hooks.slow_tenant_tries.store(false, Ordering::SeqCst);
    assert_eq!(raw_status(addr, &get_line(b"/files/a")).await, 200);
    assert_eq!(raw_status(addr, &get_line(b"/files/b")).await, 429);
}
