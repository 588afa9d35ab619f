//! The tenant stage: one tenant's flood does not deny another, hostile or
//! random tenant ids cost bounded state and never panic.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use broker_axum::{FromExtension, FromHeader, Pressure};
use common::{count, serve, statuses, TestBroker};
use http::{HeaderName, Request, StatusCode};
use tower::ServiceExt;

const CONFIG: &str = r#"{
    "perService": { "rest": { "requestsPerMinute": 10 } },
    "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 5 } }
}"#;

fn app(pressure: &Pressure) -> Router {
    Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
        .layer(pressure.layer())
}

#[tokio::test]
async fn tenant_a_flood_does_not_deny_tenant_b() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/work");

    let a = statuses(&client, &url, Some(("x-tenant", "tenant-a")), 20).await;
    assert_eq!(count(&a, 200), 5, "A gets its 5 per minute");
    assert_eq!(count(&a, 429), 15);
    // A sent 20 requests, more than the shared service limit of 10: the 15
    // its tenant quota denied gave their service cost back.
    let b = statuses(&client, &url, Some(("x-tenant", "tenant-b")), 5).await;
    assert_eq!(b, [200; 5], "B is not denied by A's flood");
    assert_eq!(t.stat("pressure:tenant", |s| s.denied), 15);
    assert_eq!(t.stat("pressure:service:rest", |s| s.denied), 0);
}

/// A path with an encoded `/` under a wildcard route is charged on two
/// routes (see `route_limits.rs`); a tenant denial gives both their cost
/// back, so one tenant's refused flood of such paths leaves the routes'
/// limits to the others.
#[tokio::test]
async fn a_tenant_denial_gives_both_readings_of_a_path_their_cost_back() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{
        "perRoute": [
            { "resource": "route:files", "pathPrefix": "/files", "limits": { "requestsPerMinute": 3 } },
            { "resource": "route:private", "pathPrefix": "/files/private", "limits": { "requestsPerMinute": 2 } }
        ],
        "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } }
    }"#,
    );
    let app = Router::new()
        .route("/files/{*path}", get(|| async { "file" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
        .layer(pressure.layer());
    let addr = serve(app).await;
    let status = |path: &'static str, tenant: &'static str| async move {
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nx-tenant: {tenant}\r\nConnection: close\r\n\r\n"
        );
        common::raw_status(addr, head.as_bytes()).await
    };
    assert_eq!(status("/files/private%2Fa", "a").await, 200);
    for _ in 0..4 {
        assert_eq!(status("/files/private%2Fb", "a").await, 429);
    }
    assert_eq!(t.stat("pressure:tenant", |s| s.denied), 4);
    // Both routes got the refused four back: `b` has the second of
    // `/files/private`'s two, and `c` and `d` the rest of `/files`'s three.
    assert_eq!(status("/files/private%2Fc", "b").await, 200);
    assert_eq!(status("/files/private/d", "c").await, 429);
    assert_eq!(t.stat("route:private", |s| s.denied), 1);
    assert_eq!(status("/files/x", "d").await, 200);
    assert_eq!(status("/files/y", "e").await, 429);
    assert_eq!(t.stat("route:files", |s| s.denied), 1);
}

#[tokio::test]
async fn tenant_retry_after_follows_its_refill_and_quota_returns_with_time() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/work");
    let a = statuses(&client, &url, Some(("x-tenant", "a")), 6).await;
    assert_eq!(a, [200, 200, 200, 200, 200, 429]);
    let res = client
        .get(&url)
        .header("x-tenant", "a")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers()["retry-after"],
        "12",
        "5/min: one token per 12 s"
    );
    t.clock.advance(Duration::from_secs(12));
    assert_eq!(
        statuses(&client, &url, Some(("x-tenant", "a")), 2).await,
        [200, 429]
    );
}

#[tokio::test]
async fn requests_without_tenant_pass_the_tenant_stage() {
    let t = TestBroker::new();
    let pressure = t.pressure(CONFIG);
    let addr = serve(app(&pressure)).await;
    let got = statuses(
        &reqwest::Client::new(),
        &format!("http://{addr}/work"),
        None,
        11,
    )
    .await;
    assert_eq!(count(&got, 200), 10, "only the service limit applies");
    assert_eq!(t.stat("pressure:tenant", |s| s.allowed + s.denied), 0);
}

fn get_with(tenant: &[u8]) -> Request<Body> {
    let mut req = Request::get("/work").body(Body::empty()).unwrap();
    req.headers_mut().insert(
        HeaderName::from_static("x-tenant"),
        http::HeaderValue::from_bytes(tenant).unwrap(),
    );
    req
}

#[tokio::test]
async fn random_tenant_flood_keeps_bounded_state_and_denies_no_one() {
    let t = TestBroker::new();
    let pressure =
        t.pressure(r#"{ "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 2 } } }"#);
    let app = app(&pressure);
    for i in 0..5_000u32 {
        let id = format!("random-{}", i.wrapping_mul(2_654_435_761));
        let res = app.clone().oneshot(get_with(id.as_bytes())).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "a new tenant is never denied");
    }
    let res = app.clone().oneshot(get_with(b"steady")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "the flood did not deny another tenant"
    );
    // Idle tenant states (refilled) are evicted by the backend: nothing is
    // kept per tenant once its bucket is full again.
    t.clock.advance(Duration::from_secs(60));
    t.backend.evict_idle();
    assert_eq!(t.backend.len(), 0, "no per-tenant state survives idleness");
}

/// Past the store's bound, a flood of new tenant ids over a socket keeps
/// the store at the bound, and a tenant dropped to make room comes back
/// with no more than it had: no tenant's limit is multiplied by the flood.
#[tokio::test]
async fn a_flood_past_the_state_bound_keeps_memory_and_every_tenant_limit() {
    const BOUND: usize = 64;
    let t = TestBroker::bounded(BOUND);
    let pressure =
        t.pressure(r#"{ "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 5 } } }"#);
    let addr = serve(app(&pressure)).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/work");
    let tenant = |id: &'static str| Some(("x-tenant", id));
    assert_eq!(
        statuses(&client, &url, tenant("drained"), 5).await,
        [200; 5]
    );
    // Tenants that used 2 of their 5 before the flood.
    let steady: Vec<String> = (0..8).map(|i| format!("steady-{i}")).collect();
    for id in &steady {
        let got = statuses(&client, &url, Some(("x-tenant", id)), 2).await;
        assert_eq!(got, [200; 2]);
    }

    let mut admitted = 0;
    for i in 0..300u32 {
        let id = format!("random-{}", i.wrapping_mul(2_654_435_761));
        let got = statuses(&client, &url, Some(("x-tenant", &id)), 1).await;
        admitted += count(&got, 200);
    }
    // The tenant resource's places (512 at this bound: half the budget)
    // hold the dropped states: 300 new tenants seldom share one, and
    // nothing refills (the clock stands), so nearly every new tenant is
    // admitted.
    assert!(admitted >= 290, "{admitted} of 300 new tenants admitted");
    assert!(
        t.backend.len() <= BOUND + 1,
        "{} states held",
        t.backend.len()
    );
    assert!(t.backend.folded() > 200);

    let res = client
        .get(&url)
        .header("x-tenant", "drained")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "still drained");
    assert_eq!(res.headers()["retry-after"], "12");
    // A folded tenant gets back no more than it had; one whose place it
    // came to share with `drained` (one chance in 512) gets nothing for
    // now, so most, not all, get some.
    let mut left = Vec::new();
    for id in &steady {
        left.push(count(
            &statuses(&client, &url, Some(("x-tenant", id)), 5).await,
            200,
        ));
    }
    assert!(
        left.iter().all(|&n| n <= 3),
        "no more than the 3 they had: {left:?}"
    );
    let some = left.iter().filter(|&&n| n >= 1).count();
    assert!(some >= 7, "{left:?}");
}

#[tokio::test]
async fn hostile_tenant_ids_never_panic_and_stay_apart() {
    let t = TestBroker::new();
    let pressure =
        t.pressure(r#"{ "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } } }"#);
    let app = app(&pressure);
    let long = vec![b'x'; 8 * 1024];
    let hostile: [&[u8]; 6] = [
        b"a:b{c}",
        b"a:b{c}%",
        &[0xff, 0xfe, 0x80],
        &[0xff, 0xfe, 0x81],
        b"",
        &long,
    ];
    for id in hostile {
        let first = app.clone().oneshot(get_with(id)).await.unwrap();
        assert_eq!(
            first.status(),
            StatusCode::OK,
            "{id:?}: its own fresh quota"
        );
        let second = app.clone().oneshot(get_with(id)).await.unwrap();
        assert_eq!(
            second.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{id:?}: quota used"
        );
    }
}

#[derive(Clone)]
struct Claims {
    namespace_id: String,
}

#[tokio::test]
async fn tenant_from_auth_extension_is_limited_per_namespace() {
    let t = TestBroker::new();
    let pressure =
        t.pressure(r#"{ "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } } }"#);
    let app = Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(pressure.tenant_layer(FromExtension::new(|c: &Claims| c.namespace_id.as_str())))
        .layer(axum::middleware::from_fn(
            |mut req: Request<Body>, next: axum::middleware::Next| async move {
                // A stand-in for JWT verification: the namespace claim.
                if let Some(ns) = req.headers().get("x-namespace").cloned() {
                    let namespace_id = ns.to_str().unwrap_or_default().to_owned();
                    req.extensions_mut().insert(Claims { namespace_id });
                }
                next.run(req).await
            },
        ))
        .layer(pressure.layer());
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/work");
    assert_eq!(
        statuses(&client, &url, Some(("x-namespace", "ns1")), 2).await,
        [200, 429]
    );
    assert_eq!(
        statuses(&client, &url, Some(("x-namespace", "ns2")), 1).await,
        [200]
    );
}

/// The limits the nested-call cases use: one request a minute for the
/// service, two for the route `/part`, and one a minute per tenant.
const NESTED: &str = r#"{
    "perService": { "rest": { "requestsPerMinute": 1 } },
    "perRoute": [{ "resource": "route:part", "pathPrefix": "/part", "limits": { "requestsPerMinute": 2 } }],
    "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } }
}"#;

/// Which stages of the same [`Pressure`] the nested call to `/part` goes
/// through.
#[derive(Clone, Copy)]
enum PartStages {
    /// The tenant stage only.
    Tenant,
    /// The route/service stage (its own route, `/part`, two calls a
    /// minute), then the tenant stage: the whole stack.
    RouteAndTenant,
}

/// An app whose handler, at `/work`, answers with the response of a nested
/// call to `/part` through `part_stages` of the same [`Pressure`]
/// (tenant `parts`), behind the route/service stage and, with
/// `own_tenant_stage`, a tenant stage of the request's own.
struct Nested {
    app: Router,
    parts: Router,
    /// The requests that reached the handler.
    reached: Arc<AtomicUsize>,
}

impl Nested {
    fn new(pressure: &Pressure, own_tenant_stage: bool, part_stages: PartStages) -> Self {
        let tenant = || FromHeader::new(HeaderName::from_static("x-tenant"));
        let parts = Router::new()
            .route("/part", get(|| async { "part" }))
            .layer(pressure.tenant_layer(tenant()));
        let parts = match part_stages {
            PartStages::Tenant => parts,
            PartStages::RouteAndTenant => parts.layer(pressure.layer()),
        };
        let reached = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (parts, reached) = (parts.clone(), reached.clone());
            move || {
                let (parts, reached) = (parts.clone(), reached.clone());
                async move {
                    reached.fetch_add(1, Ordering::SeqCst);
                    parts.oneshot(Self::part()).await.unwrap()
                }
            }
        };
        let app = Router::new().route("/work", get(handler));
        let app = match own_tenant_stage {
            true => app.layer(pressure.tenant_layer(tenant())),
            false => app,
        };
        let app = app.layer(pressure.layer());
        Self {
            app,
            parts,
            reached,
        }
    }

    fn part() -> Request<Body> {
        let req = Request::get("/part").header("x-tenant", "parts");
        req.body(Body::empty()).unwrap()
    }

    /// Spends the quota of the part's tenant, so the handler answers 429.
    async fn spend_the_part(&self) {
        let spent = self.parts.clone().oneshot(Self::part()).await.unwrap();
        assert_eq!(spent.status(), StatusCode::OK);
    }

    fn reached(&self) -> usize {
        self.reached.load(Ordering::SeqCst)
    }
}

/// A handler that answers with the denial of a nested call through the
/// tenant stage of the same [`Pressure`] (a part of its work, refused)
/// was reached: the route/service stage keeps its cost, whether the
/// request had a tenant of its own or not. Before, the route/service stage
/// took that denial for its own request's and gave its cost back, and
/// served twice its limit.
#[tokio::test]
async fn a_nested_tenant_denial_answered_by_the_handler_keeps_the_route_charged() {
    let t = TestBroker::new();
    let nested = Nested::new(&t.pressure(NESTED), true, PartStages::Tenant);
    let addr = serve(nested.app.clone()).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/work");
    // Each request with a tenant of its own (none in the second round),
    // so no tenant stage of the request's own denies it.
    for (round, tenants) in [[Some("a"), Some("b"), Some("c")], [None; 3]]
        .into_iter()
        .enumerate()
    {
        nested.spend_the_part().await;
        for tenant in tenants {
            let got = statuses(&client, &url, tenant.map(|t| ("x-tenant", t)), 1).await;
            assert_eq!(got, [429], "round {round}");
        }
        assert_eq!(
            nested.reached(),
            round + 1,
            "round {round}: one request a minute reaches the handler"
        );
        assert_eq!(
            t.stat("pressure:service:rest", |s| s.denied),
            2 * (round as u64 + 1)
        );
        t.clock.advance(Duration::from_secs(60));
    }
}

/// A route with no tenant stage of its own, whose handler answers with
/// the denial of a nested call through the tenant stage of the same
/// [`Pressure`]: the request reached its handler, so the route/service
/// stage keeps its cost. Before, it took that denial for its own
/// request's tenant denial, gave its cost back, and served every request.
#[tokio::test]
async fn a_nested_tenant_denial_on_a_route_without_a_tenant_stage_keeps_the_route_charged() {
    route_without_a_tenant_stage(PartStages::Tenant).await;
}

/// A route with no tenant stage of its own, whose handler answers with
/// the denial of a nested call through the whole stack of the same
/// [`Pressure`] (the route/service stage of `/part`, then the tenant
/// stage): the nested call's route stage gives its own cost back, and the
/// outer route stage keeps its own, as its request reached its handler.
/// Before, the denial still named its policy once the nested route stage
/// had refunded, so the outer route stage gave its cost back too and
/// served every request.
#[tokio::test]
async fn a_nested_denial_through_the_whole_stack_keeps_the_outer_route_charged() {
    let t = route_without_a_tenant_stage(PartStages::RouteAndTenant).await;
    // The nested calls' route stage gave each refused call's cost back:
    // of its two calls a minute, the spent part took one.
    assert_eq!(t.stat("route:part", |s| s.denied), 0);
}

/// Three requests to a route with no tenant stage of its own, whose
/// handler answers with the denial of a nested call through `part_stages`
/// (the part's tenant quota spent first): one reaches the handler, and
/// the route/service stage denies the other two, as it kept the first's
/// cost. The broker, for more checks.
async fn route_without_a_tenant_stage(part_stages: PartStages) -> TestBroker {
    let t = TestBroker::new();
    let nested = Nested::new(&t.pressure(NESTED), false, part_stages);
    let addr = serve(nested.app.clone()).await;
    nested.spend_the_part().await;
    let url = format!("http://{addr}/work");
    let got = statuses(&reqwest::Client::new(), &url, None, 3).await;
    assert_eq!(got, [429; 3]);
    assert_eq!(
        nested.reached(),
        1,
        "one request a minute reaches the handler"
    );
    assert_eq!(t.stat("pressure:service:rest", |s| s.denied), 2);
    t
}

/// A text tenant equal to what `FromHeader` made of a non-UTF-8 value
/// (`U+FFFD`, `~`, 16 bytes of its SHA-256 in hex) gets a bucket of its own.
/// Before, both reached one state, and the text tenant was denied at once.
#[tokio::test]
async fn a_text_tenant_never_shares_the_bucket_of_a_byte_tenant() {
    use sha2::{Digest, Sha256};
    let t = TestBroker::new();
    let pressure =
        t.pressure(r#"{ "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } } }"#);
    let value: &[u8] = &[0xff, 0xfe, b'a'];
    let digest = Sha256::digest(value);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let text = format!("\u{FFFD}~{hex}");
    let by_text = Router::new()
        .route("/text", get(|| async { "text" }))
        .layer(pressure.tenant_layer(FromExtension::new(|c: &Claims| c.namespace_id.as_str())))
        .layer(axum::middleware::from_fn(
            move |mut req: Request<Body>, next: axum::middleware::Next| {
                let namespace_id = text.clone();
                async move {
                    req.extensions_mut().insert(Claims { namespace_id });
                    next.run(req).await
                }
            },
        ));
    let by_bytes = Router::new()
        .route("/bytes", get(|| async { "bytes" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))));
    let addr = serve(by_text.merge(by_bytes).layer(pressure.layer())).await;
    let send = |path: &str| {
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nx-tenant: ").into_bytes();
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        async move { common::raw_status(addr, &head).await }
    };
    assert_eq!(send("/bytes").await, 200, "the byte tenant's one request");
    assert_eq!(send("/text").await, 200, "the text tenant's own bucket");
    assert_eq!(send("/text").await, 429, "and its one request is used");
    assert_eq!(send("/bytes").await, 429);
}
