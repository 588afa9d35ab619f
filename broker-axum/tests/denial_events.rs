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
    assert_eq!(field(tenant, "tenant"), Some("acme"));
    assert_eq!(field(tenant, "wait_ms"), Some("60000"));
    let service = &events[1];
    assert_eq!(field(service, "resource"), Some("pressure:service:rest"));
    assert_eq!(field(service, "layer"), Some("service"));
    assert_eq!(field(service, "tenant"), None);
    assert_eq!(field(service, "wait_ms"), Some("20000"));
}
