//! The inner call of an admitted request; its response body takes the
//! concurrency permit along.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use broker_core::Permit;
use http::{header, Method, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::Service;

use crate::body::PermitBody;

pin_project! {
    /// The inner call `fut`, whose response takes `permit` along.
    pub(crate) struct Carry<F> {
        #[pin]
        fut: F,
        permit: Permit,
        // The request is a `CONNECT` (see `is_long_lived`).
        connect: bool,
    }
}

impl<F> Carry<F> {
    /// Calls `inner` with `req`, the response taking `permit` along.
    pub(crate) fn call<S, ReqB>(inner: &mut S, req: Request<ReqB>, permit: Permit) -> Self
    where
        S: Service<Request<ReqB>, Future = F>,
    {
        let connect = permit.is_held() && req.method() == Method::CONNECT;
        Self {
            fut: inner.call(req),
            permit,
            connect,
        }
    }
}

impl<F, B, E> Future for Carry<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: PermitBody,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut out = ready!(this.fut.poll(cx));
        if let (Ok(res), true) = (&mut out, this.permit.is_held()) {
            let permit = std::mem::take(this.permit);
            // A long-lived response releases the slot here, at once.
            if !is_long_lived(*this.connect, res) {
                res.body_mut().hold(permit);
            }
        }
        Poll::Ready(out)
    }
}

/// A response that lasts as long as the client stays, so holds no slot: an
/// upgrade, a `CONNECT` tunnel, or an event stream of no set length.
fn is_long_lived<B: PermitBody>(connect: bool, res: &Response<B>) -> bool {
    res.status() == StatusCode::SWITCHING_PROTOCOLS
        || (connect && res.status().is_success())
        || (!res.body().has_exact_length() && is_event_stream(res))
}

fn is_event_stream<B>(res: &Response<B>) -> bool {
    res.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.as_bytes().get(..17))
        .is_some_and(|ct| ct.eq_ignore_ascii_case(b"text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderName, HeaderValue};

    /// A map with `n` other fields, then `name: value` if given.
    fn map(n: usize, extra: Option<(HeaderName, &'static str)>) -> HeaderMap {
        let mut h = HeaderMap::new();
        for i in 0..n {
            h.insert(
                HeaderName::try_from(format!("x-field-{i}")).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        if let Some((name, value)) = extra {
            h.append(name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn long_lived_responses_are_recognised_among_many_fields() {
        // A body of no set length: the fields decide.
        let mut res = Response::new(axum::body::Body::new(Endless));
        *res.headers_mut() = map(20, Some((header::CONTENT_TYPE, "Text/Event-Stream; x=1")));
        assert!(is_long_lived(false, &res));
        *res.headers_mut() = map(1, Some((header::CONTENT_TYPE, "text/plain")));
        assert!(!is_long_lived(false, &res));
        for (ct, long_lived) in [
            ("text/plain; charset=utf-8", false),
            ("text/eventx-stream", false),
            ("TEXT/EVENT-STREAM;charset=utf-8", true),
        ] {
            *res.headers_mut() = map(1, Some((header::CONTENT_TYPE, ct)));
            assert_eq!(is_long_lived(false, &res), long_lived, "{ct}");
        }
        *res.headers_mut() = map(1, Some((header::CONTENT_TYPE, "text/plain")));
        *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        assert!(is_long_lived(false, &res));
        // A tunnel opened by CONNECT; the same status for any other request
        // holds its slot, and a refused CONNECT too.
        *res.status_mut() = StatusCode::OK;
        assert!(is_long_lived(true, &res));
        assert!(!is_long_lived(false, &res));
        *res.status_mut() = StatusCode::FORBIDDEN;
        assert!(!is_long_lived(true, &res));
    }

    /// A body of no set length.
    struct Endless;

    impl http_body::Body for Endless {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[test]
    fn an_event_stream_of_known_length_is_not_long_lived() {
        use crate::PressureBody;
        use http_body_util::{BodyExt, Full};
        fn events<B: PermitBody>(body: B) -> Response<B> {
            let mut res = Response::new(body);
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            res
        }
        let text = || bytes::Bytes::from_static(b"data: x\n\n");
        assert!(is_long_lived(
            false,
            &events(axum::body::Body::new(Endless))
        ));
        assert!(!is_long_lived(
            false,
            &events(axum::body::Body::from(text()))
        ));
        assert!(is_long_lived(
            false,
            &events(PressureBody::new(Endless, None))
        ));
        let sized = PressureBody::new(Full::new(text()), None);
        assert!(!is_long_lived(false, &events(sized)));
        let fixed: PressureBody<Endless> = PressureBody::fixed(text());
        assert!(!is_long_lived(false, &events(fixed)));
        let boxed = || Full::new(text()).map_err(|never| match never {});
        assert!(!is_long_lived(false, &events(boxed().boxed())));
        assert!(!is_long_lived(false, &events(boxed().boxed_unsync())));
        let endless = || Endless.map_err(|never| match never {});
        assert!(is_long_lived(false, &events(endless().boxed())));
        assert!(is_long_lived(false, &events(endless().boxed_unsync())));
    }
}
