//! One structured `tracing` event per denial, none per allowed request.

mod common;

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use broker_axum::FromHeader;
use common::TestBroker;
use http::{HeaderName, Request, StatusCode};
use tower::ServiceExt;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The fields of one event, in order.
type Recorded = Vec<(String, String)>;

#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Recorded>>>);

struct Fields(Recorded);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_owned(), value.to_string()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if !event.metadata().target().starts_with("broker_axum") {
            return;
        }
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

fn field<'a>(event: &'a [(String, String)], name: &str) -> Option<&'a str> {
    event
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "current_thread")]
async fn one_event_per_denial_and_none_per_allowed_request() {
    let events = Events::default();
    let _guard =
        broker_testkit::capture_scoped(tracing_subscriber::registry().with(events.clone()));

    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{
        "perService": { "rest": { "requestsPerMinute": 3 } },
        "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 1 } }
    }"#,
    );
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
        .layer(pressure.layer());
    let call = |tenant: Option<&'static str>| {
        let app = app.clone();
        async move {
            let mut req = Request::get("/").body(Body::empty()).unwrap();
            if let Some(t) = tenant {
                req.headers_mut().insert("x-tenant", t.parse().unwrap());
            }
            app.oneshot(req).await.unwrap().status()
        }
    };
    assert_eq!(call(Some("acme")).await, StatusCode::OK);
    assert_eq!(call(None).await, StatusCode::OK);
    assert!(
        events.0.lock().unwrap().is_empty(),
        "nothing logged for allowed requests"
    );

    assert_eq!(call(Some("acme")).await, StatusCode::TOO_MANY_REQUESTS); // tenant
    assert_eq!(call(None).await, StatusCode::OK); // the tenant denial's cost came back
    assert_eq!(call(None).await, StatusCode::TOO_MANY_REQUESTS); // service

    let events = events.0.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    let tenant = &events[0];
    assert_eq!(field(tenant, "resource"), Some("pressure:tenant"));
    assert_eq!(field(tenant, "layer"), Some("tenant"));
    let acme = pressure.tenant_key("acme");
    assert_eq!(field(tenant, "tenant"), Some(acme.as_str()));
    assert_eq!(field(tenant, "wait_ms"), Some("60000"));
    let service = &events[1];
    assert_eq!(field(service, "resource"), Some("pressure:service:rest"));
    assert_eq!(field(service, "layer"), Some("service"));
    assert_eq!(field(service, "tenant"), None);
    assert_eq!(field(service, "wait_ms"), Some("20000"));
}

/// An app that keys tenants by API key: the denial log names the tenant
/// by fingerprint, never by the key, even when the key is short and plain.
/// Before, the line held `tenant="sk_live_4eC39HqLyjWDarjtT1zdp7dc"`.
#[tokio::test(flavor = "current_thread")]
async fn an_api_key_tenant_is_logged_as_a_fingerprint() {
    let text = denial_log_of(r#"{ "enabled": true, "limits": { "requestsPerMinute": 1 } }"#).await;
    assert!(text.contains("tenant="), "{text}");
    assert!(!text.contains("sk_live"), "the API key in the log: {text}");
}

/// With `clearIds` (for debugging), a plain id is logged as it is.
#[tokio::test(flavor = "current_thread")]
async fn clear_ids_are_logged_in_clear_when_asked_for() {
    let text = denial_log_of(
        r#"{ "enabled": true, "clearIds": true, "limits": { "requestsPerMinute": 1 } }"#,
    )
    .await;
    assert!(text.contains(&format!("tenant={API_KEY:?}")), "{text}");
}

/// The tenant id [`denial_log_of`] sends: an API key.
const API_KEY: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";

/// Everything logged (debug level and up) while tenant [`API_KEY`] sends
/// two requests to an app whose `perTenant` object is `per_tenant`
/// (allowing one), with the count of denial lines checked.
async fn denial_log_of(per_tenant: &str) -> String {
    let (logs, _guard) = broker_testkit::capture_logs(tracing::Level::DEBUG);
    let t = TestBroker::new();
    let pressure = t.pressure(&format!(r#"{{ "perTenant": {per_tenant} }}"#));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(pressure.tenant_layer(FromHeader::new(HeaderName::from_static("x-tenant"))))
        .layer(pressure.layer());
    let addr = common::serve(app).await;
    let got = common::statuses(
        &reqwest::Client::new(),
        &format!("http://{addr}/"),
        Some(("x-tenant", API_KEY)),
        2,
    )
    .await;
    assert_eq!(got, [200, 429]);
    let text = logs.text();
    assert_eq!(logs.count("INFO", "request denied"), 1, "{text}");
    text
}
