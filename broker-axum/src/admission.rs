//! One stage's admission of one request: the broker's answer, then the inner
//! call (its body holds the permit) or the refusal. A refused tenant stage
//! gives back the route/service stage's [`Charge`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use broker_core::{Acquisition, BrokerError, Cost, Marks, Permit};
use http::{header, Method, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::Service;

use crate::body::PermitBody;
use crate::policy::{Policy, Stage};
use crate::response;

/// A route/service admission on `stage`, given back once at most; bit `i`
/// of `here` is set when the store's failure policy answered part `i`.
#[derive(Clone)]
pub(crate) struct Charge {
    policy: Arc<Policy>,
    stage: Stage,
    here: u8,
    given_back: Arc<AtomicBool>,
}

impl Charge {
    fn new(policy: &Arc<Policy>, stage: Stage, here: u8) -> Self {
        let (policy, given_back) = (policy.clone(), Arc::default());
        Self {
            policy,
            stage,
            here,
            given_back,
        }
    }

    /// Takes the charge of the policy `policy` out of `req`, if it has one.
    pub(crate) fn take<B>(req: &mut Request<B>, policy: u64) -> Option<Self> {
        let ours = (req.extensions().get::<Self>()).is_some_and(|c| c.policy.id == policy);
        ours.then(|| req.extensions_mut().remove()).flatten()
    }

    /// Gives each part its cost back where it was charged, from a task that
    /// outlives the caller (in place outside a runtime); a failed refund
    /// leaves it charged.
    fn give_back(&self) -> Option<Refund> {
        if self.given_back.swap(true, Ordering::Relaxed) {
            return None;
        }
        let (policy, stage, here) = (self.policy.clone(), self.stage, self.here);
        let refund = async move {
            for (i, at) in stage.parts().enumerate() {
                let since = (here >> i & 1 == 1).then_some(Marks::ANSWERED_HERE);
                let (broker, id) = (&policy.broker, policy.limited(at).handle.resource());
                let _ = (broker.settle(id, Cost::default(), Cost::requests(0), since)).await;
            }
        };
        Some(match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let task = runtime.spawn(refund);
                // A refund that panicked only leaves the cost charged.
                Box::pin(async move {
                    let _ = task.await;
                })
            }
            Err(_) => Box::pin(refund),
        })
    }
}

/// A charge being given back.
type Refund = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A charge given back if dropped before the answer (the client left).
struct Unanswered(Option<Charge>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        drop(self.0.take().and_then(|c| c.give_back()));
    }
}

/// The permit of an admitted request, with the charge a tenant stage after
/// it gives back; or the response refusing it.
type Decided<B> = Result<(Permit, Option<Charge>), Response<B>>;

pin_project! {
    /// The response future of both stages' services: the refusal, or the
    /// inner call, whose response body takes the concurrency permit along.
    /// Its error is the inner service's error.
    pub struct ResponseFuture<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        #[pin]
        state: State<S, ReqB, ResB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // The store needs I/O, or a refusal (after a refund, if any). `call`:
        // the ready inner service (taken in `call`, as tower does) and the request.
        Asking {
            asking: Pin<Box<dyn Future<Output = Decided<ResB>> + Send>>,
            call: Option<Box<(S, Request<ReqB>)>>,
        },
        // Admitted; `connect`: the request is a `CONNECT` (see `is_long_lived`).
        Calling {
            #[pin]
            call: S::Future,
            permit: Permit,
            connect: bool,
        },
    }
}

impl<S, ReqB, ResB> State<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    /// Calls `inner` with `req`, admitted with `permit` (and `charge`).
    fn calling(
        inner: &mut S,
        mut req: Request<ReqB>,
        permit: Permit,
        charge: Option<Charge>,
    ) -> Self {
        if let Some(charge) = charge {
            req.extensions_mut().insert(charge);
        }
        let connect = permit.is_held() && req.method() == Method::CONNECT;
        let call = inner.call(req);
        State::Calling {
            call,
            permit,
            connect,
        }
    }
}

impl<S, ReqB, ResB> ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody + Send + 'static,
{
    /// Admits `req` on `stage` (the tenant's if given; none passes it), then
    /// calls `inner`; a refusal gives `charge` back.
    pub(crate) fn admit(
        policy: &Arc<Policy>,
        stage: Option<Stage>,
        tenant: Option<String>,
        charge: Option<Charge>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        let Some(stage) = stage else {
            let state = State::calling(inner, req, Permit::empty(), None);
            return Self { state };
        };
        let key = tenant.as_deref();
        // The route/service stage hands a tenant stage after it its charge.
        let charges = key.is_none() && policy.tenant.is_some();
        let now = (stage.1.is_none())
            .then(|| (policy.limited(stage.0).handle).try_acquire_now(key, Cost::default()))
            .flatten();
        let state = match now.map(|result| judge(policy, stage.0, result, key)) {
            Some(Ok((permit, here))) => {
                let charged = charges.then(|| Charge::new(policy, stage, here));
                State::calling(inner, req, permit, charged)
            }
            Some(Err(res)) => {
                let refund = charge.and_then(|c| c.give_back());
                let asking = Box::pin(after(refund, Err(res)));
                State::Asking { asking, call: None }
            }
            None => {
                let clone = inner.clone();
                let inner = std::mem::replace(inner, clone);
                let asking = ask(policy.clone(), stage, tenant, charges, Unanswered(charge));
                State::Asking {
                    asking: Box::pin(asking),
                    call: Some(Box::new((inner, req))),
                }
            }
        };
        Self { state }
    }
}

/// The broker's answer on `stage`, part by part: the first part of two is
/// given back if the second refuses or the client leaves meanwhile; so is
/// `charge` if the client leaves before the answer, or it refuses.
async fn ask<B: PermitBody>(
    policy: Arc<Policy>,
    stage: Stage,
    tenant: Option<String>,
    charges: bool,
    mut charge: Unanswered,
) -> Decided<B> {
    let key = tenant.as_deref();
    let (mut permit, mut here) = (Permit::empty(), 0);
    for (i, at) in stage.parts().enumerate() {
        let result = (policy.limited(at).handle)
            .try_acquire(key, Cost::default())
            .await;
        match judge(&policy, at, result, key) {
            Ok((part, part_here)) => {
                permit = permit.join(part);
                here |= part_here << i;
                if stage.1.is_some() && i == 0 {
                    charge.0 = Some(Charge::new(&policy, Stage(at, None), here));
                }
            }
            Err(res) => {
                drop(permit);
                return after(charge.0.take().and_then(|c| c.give_back()), Err(res)).await;
            }
        }
    }
    charge.0 = None;
    Ok((permit, charges.then(|| Charge::new(&policy, stage, here))))
}

/// `decided`, once `refund` (if any) has run.
async fn after<B>(refund: Option<Refund>, decided: Decided<B>) -> Decided<B> {
    if let Some(refund) = refund {
        refund.await;
    }
    decided
}

/// The permit of an admitted request and whether the failure policy answered;
/// or the response refusing it (logged; a backend failure at debug level, as
/// the broker warns).
fn judge<B: PermitBody>(
    policy: &Policy,
    at: u32,
    result: Result<Acquisition, BrokerError>,
    tenant: Option<&str>,
) -> Result<(Permit, u8), Response<B>> {
    let limited = policy.limited(at);
    let (resource, layer) = (limited.handle.resource(), limited.layer);
    let a = match result {
        Ok(a) if a.allowed => return Ok((a.permit, u8::from(a.answered_here))),
        Ok(a) => a,
        Err(error) => {
            tracing::debug!(resource, layer, tenant, %error,
                "pressure check failed; answering the backend-error status");
            return Err(response::backend_failed(&policy.responses));
        }
    };
    tracing::info!(
        resource,
        layer,
        wait_ms = u64::try_from(a.wait_time.as_millis()).unwrap_or(u64::MAX),
        tenant,
        denied_by = ?a.denied_by,
        "request denied"
    );
    // The limits in force, also after a reload (the broker has no others).
    let limits = policy.broker.limits(resource).unwrap_or_default();
    Err(response::denied(&policy.responses, resource, &limits, &a))
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        const DONE: &str = "ResponseFuture polled after completion";
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Asking { asking, call } => {
                    let (permit, charge) = match ready!(asking.as_mut().poll(cx)) {
                        Ok(admitted) => admitted,
                        Err(refusal) => return Poll::Ready(Ok(refusal)),
                    };
                    let (mut inner, req) = *call.take().expect(DONE);
                    state.set(State::calling(&mut inner, req, permit, charge));
                }
                StateProj::Calling {
                    call,
                    permit,
                    connect,
                } => {
                    let mut out = ready!(call.poll(cx));
                    if let (Ok(res), true) = (&mut out, permit.is_held()) {
                        let permit = std::mem::take(permit);
                        // A long-lived response releases the slot here, at once.
                        if !is_long_lived(*connect, res) {
                            res.body_mut().hold(permit);
                        }
                    }
                    return Poll::Ready(out);
                }
            }
        }
    }
}

/// A response that lasts as long as the client stays, so holds no slot: an
/// upgrade, a `CONNECT` tunnel, or an event stream of no set length.
fn is_long_lived<B: PermitBody>(connect: bool, res: &Response<B>) -> bool {
    let event_stream = || {
        (res.headers().get(header::CONTENT_TYPE))
            .and_then(|v| v.as_bytes().get(..17))
            .is_some_and(|ct| ct.eq_ignore_ascii_case(b"text/event-stream"))
    };
    res.status() == StatusCode::SWITCHING_PROTOCOLS
        || (connect && res.status().is_success())
        // A body of known length holds its slot to the end whatever its type.
        || (res.body().size_hint().exact().is_none() && event_stream())
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
        let boxed = || Full::new(text()).map_err(|never| match never {});
        assert!(!is_long_lived(false, &events(boxed().boxed())));
        assert!(!is_long_lived(false, &events(boxed().boxed_unsync())));
        let endless = || Endless.map_err(|never| match never {});
        assert!(is_long_lived(false, &events(endless().boxed())));
        assert!(is_long_lived(false, &events(endless().boxed_unsync())));
    }
}
