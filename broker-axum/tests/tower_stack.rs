//! The layers in a plain tower stack (no axum): the inner service's error
//! and body types pass through unchanged.

mod common;

use bytes::Bytes;
use common::TestBroker;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

/// The inner service's own error type.
#[derive(Debug, PartialEq)]
struct UpstreamDown;

type Body = BoxBody<Bytes, std::io::Error>;

async fn handler(req: Request<()>) -> Result<Response<Body>, UpstreamDown> {
    if req.uri().path() == "/fail" {
        return Err(UpstreamDown);
    }
    let body = Full::new(Bytes::from_static(b"ok")).map_err(|never| match never {});
    Ok(Response::new(body.boxed()))
}

#[tokio::test]
async fn error_and_body_types_pass_through_a_tower_stack() {
    let t = TestBroker::new();
    let pressure = t.pressure(
        r#"{ "perService": { "rest": { "requestsPerMinute": 2, "maxConcurrentRequests": 5 } } }"#,
    );
    // The stack's types are the handler's: Response<Body>, UpstreamDown.
    let mut svc = ServiceBuilder::new()
        .layer(pressure.layer())
        .service(service_fn(handler));
    let call = |path: &'static str| Request::get(path).body(()).unwrap();

    let res: Response<Body> = svc.ready().await.unwrap().call(call("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        t.stat("pressure:service:rest", |s| s.in_flight),
        1,
        "held by the body"
    );
    assert_eq!(
        &res.into_body().collect().await.unwrap().to_bytes()[..],
        b"ok"
    );
    assert_eq!(
        t.stat("pressure:service:rest", |s| s.in_flight),
        0,
        "released at its end"
    );

    let err = svc
        .ready()
        .await
        .unwrap()
        .call(call("/fail"))
        .await
        .unwrap_err();
    assert_eq!(err, UpstreamDown, "the inner error comes out as it is");
    assert_eq!(t.stat("pressure:service:rest", |s| s.in_flight), 0);

    let denied = svc.ready().await.unwrap().call(call("/")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = denied.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], br#"{"error":"too_many_requests"}"#);
}
