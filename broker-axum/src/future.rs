//! [`ResponseFuture`]: the admission of one request. `try_acquire` on the
//! stage's resource, then either the denial (429, logged once; a tenant
//! denial first gives the route/service cost back) or the inner call,
//! whose response body takes the concurrency permit along.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use broker_core::{Acquisition, BrokerError, Cost, Permit};
use http::{header, Method, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::Service;

use crate::body::PermitBody;
use crate::policy::{Policy, Stage};
use crate::response;
use crate::tenant::TenantId;

/// The broker's answer for one stage, when it came asynchronously.
struct Answer {
    result: Result<Acquisition, BrokerError>,
    tenant: Option<TenantId>,
    policy: Arc<Policy>,
}

type AcquireFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

type RefundFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

pin_project! {
    /// The response future of [`crate::PressureService`] and
    /// [`crate::TenantService`]. Its error is the inner service's error.
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
        Admitting {
            acquire: AcquireFuture,
            call: Option<Box<Call<S, ReqB>>>,
        },
        Refunding {
            refund: RefundFuture,
            response: Option<Response<ResB>>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            permit: Option<Permit>,
            long_lived: bool,
            // Set on the route/service stage when a tenant stage follows:
            // the policy's id and the stage to refund.
            refundable: Option<(u64, Stage)>,
        },
        Answered {
            response: Option<Response<ResB>>,
        },
    }
}

/// What the inner call needs once admitted.
struct Call<S, ReqB> {
    inner: S,
    req: Request<ReqB>,
    stage: Stage,
}

/// Put in the extensions of a tenant-stage denial, naming the policy that
/// denied. The route/service stage of the same [`crate::Pressure`] sees it
/// on the way out and gives its own cost back, so one tenant's rejected
/// flood does not use up the limit every tenant shares. Nothing is added
/// to admitted requests or responses, and an admitted request holds no
/// reference to the policy for it.
#[derive(Clone)]
struct TenantDenied {
    /// The denying policy (its `id` names its [`crate::Pressure`]).
    policy: Arc<Policy>,
}

/// Gives `stage` of `policy` its cost back.
async fn refund(policy: Arc<Policy>, stage: Stage) {
    if let Some(limited) = policy.limited(stage) {
        // Errors are counted and logged by the broker; a failed refund
        // only leaves the cost charged, as without a refund.
        let _ = policy
            .broker
            .settle(&*limited.id, Cost::default(), Cost::requests(0))
            .await;
    }
}

/// A request that would hold a slot for its whole lifetime: a WebSocket
/// (or other) upgrade, or an HTTP/2 extended CONNECT.
fn is_long_lived_request<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(header::UPGRADE) || req.method() == Method::CONNECT
}

/// A response that streams for as long as the client stays: switching
/// protocols, or server-sent events.
fn is_long_lived_response<B>(res: &Response<B>) -> bool {
    res.status() == StatusCode::SWITCHING_PROTOCOLS
        || res.headers().get(header::CONTENT_TYPE).is_some_and(|v| {
            let ct = v.as_bytes();
            ct.len() >= 17 && ct[..17].eq_ignore_ascii_case(b"text/event-stream")
        })
}

impl<S, ReqB, ResB> ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    /// Passes the inner call through untouched (no limit applies to it).
    pub(crate) fn pass(fut: S::Future) -> Self {
        Self {
            state: State::Calling {
                fut,
                permit: None,
                long_lived: false,
                refundable: None,
            },
        }
    }

    /// Admits `req` on `stage` (no tenant), then calls `inner`, the
    /// service that was polled ready.
    pub(crate) fn admit(
        policy: &Arc<Policy>,
        stage: Stage,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        match judge_now(policy, stage, None) {
            Some(verdict) => Self::proceed(verdict, inner, req),
            None => Self::admit_later(policy, stage, None, inner, req),
        }
    }

    /// Goes on with what a stage decided: the inner call, or its answer.
    pub(crate) fn proceed(verdict: Verdict<ResB>, inner: &mut S, req: Request<ReqB>) -> Self {
        Self {
            state: proceed(verdict, inner, req),
        }
    }

    /// Admits `req` once the broker has answered asynchronously, then
    /// calls a ready clone of `inner`.
    pub(crate) fn admit_later(
        policy: &Arc<Policy>,
        stage: Stage,
        tenant: Option<TenantId>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        let policy = policy.clone();
        let clone = inner.clone();
        let call = Call {
            inner: std::mem::replace(inner, clone),
            req,
            stage,
        };
        let acquire: AcquireFuture = Box::pin(async move {
            let result = match policy.limited(stage) {
                Some(limited) => {
                    limited
                        .handle
                        .try_acquire(tenant.as_ref().map(TenantId::as_str), Cost::default())
                        .await
                }
                None => Ok(unlimited()),
            };
            Answer {
                result,
                tenant,
                policy,
            }
        });
        Self {
            state: State::Admitting {
                acquire,
                call: Some(Box::new(call)),
            },
        }
    }
}

/// What a stage makes of the broker's answer.
pub(crate) enum Verdict<ResB> {
    /// Call the inner service; the response takes `permit` along.
    Admit {
        permit: Option<Permit>,
        // Set on the route/service stage when a tenant stage follows.
        refundable: Option<(u64, Stage)>,
    },
    /// Answer at once (a denial or a backend failure).
    Answer(Response<ResB>),
}

/// The verdict on `stage` (for the tenant key `tenant`, if given) when the
/// broker answers without I/O (the in-memory store: no boxed future, no
/// extra poll, no clone of the inner service); `None` when it must be
/// asked asynchronously.
pub(crate) fn judge_now<ResB: PermitBody>(
    policy: &Arc<Policy>,
    stage: Stage,
    tenant: Option<&str>,
) -> Option<Verdict<ResB>> {
    let result = match policy.limited(stage) {
        Some(limited) => limited.handle.try_acquire_now(tenant, Cost::default())?,
        None => Ok(unlimited()),
    };
    Some(judge(policy, stage, result, tenant))
}

/// An allowed acquisition holding nothing (a stage without a resource).
fn unlimited() -> Acquisition {
    Acquisition {
        allowed: true,
        wait_time: std::time::Duration::ZERO,
        denied_by: None,
        permit: Permit::empty(),
    }
}

/// The verdict once the broker answered `result` (for the tenant key
/// `tenant`, if given).
fn judge<ResB: PermitBody>(
    policy: &Arc<Policy>,
    stage: Stage,
    result: Result<Acquisition, BrokerError>,
    tenant: Option<&str>,
) -> Verdict<ResB> {
    let Some(limited) = policy.limited(stage) else {
        return Verdict::Admit {
            permit: None,
            refundable: None,
        };
    };
    let acquisition = match result {
        Ok(a) => a,
        Err(error) => {
            // The broker counts backend errors and warns about them (at
            // most once per 10 s per resource); per request, this is detail.
            tracing::debug!(
                resource = %limited.id,
                layer = stage.name(),
                tenant,
                %error,
                "pressure check failed; answering the backend-error status"
            );
            return Verdict::Answer(response::backend_failed(&policy.responses));
        }
    };
    if !acquisition.allowed {
        tracing::info!(
            resource = %limited.id,
            layer = stage.name(),
            wait_ms = u64::try_from(acquisition.wait_time.as_millis()).unwrap_or(u64::MAX),
            tenant,
            denied_by = ?acquisition.denied_by,
            "request denied"
        );
        let mut response =
            response::denied(&policy.responses, &limited.headers, acquisition.wait_time);
        if matches!(stage, Stage::Tenant) {
            response.extensions_mut().insert(TenantDenied {
                policy: policy.clone(),
            });
        }
        return Verdict::Answer(response);
    }
    let permit = acquisition.permit.is_held().then_some(acquisition.permit);
    let refundable = match stage {
        Stage::Route(_) | Stage::Service if policy.has_tenant_stage() => Some((policy.id, stage)),
        _ => None,
    };
    Verdict::Admit { permit, refundable }
}

/// The next state for `verdict`.
fn proceed<S, ReqB, ResB>(
    verdict: Verdict<ResB>,
    inner: &mut S,
    req: Request<ReqB>,
) -> State<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    match verdict {
        Verdict::Admit { permit, refundable } => {
            let long_lived = permit.is_some() && is_long_lived_request(&req);
            State::Calling {
                fut: inner.call(req),
                permit,
                long_lived,
                refundable,
            }
        }
        Verdict::Answer(response) => State::Answered {
            response: Some(response),
        },
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Admitting { acquire, call } => {
                    let answer = ready!(acquire.as_mut().poll(cx));
                    let call = call.take().expect("ResponseFuture polled after completion");
                    let Call {
                        mut inner,
                        req,
                        stage,
                    } = *call;
                    let Answer {
                        result,
                        tenant,
                        policy,
                    } = answer;
                    let verdict = judge(
                        &policy,
                        stage,
                        result,
                        tenant.as_ref().map(TenantId::as_str),
                    );
                    state.set(proceed(verdict, &mut inner, req));
                }
                StateProj::Refunding { refund, response } => {
                    ready!(refund.as_mut().poll(cx));
                    let response = response.take();
                    return Poll::Ready(Ok(
                        response.expect("ResponseFuture polled after completion")
                    ));
                }
                StateProj::Calling {
                    fut,
                    permit,
                    long_lived,
                    refundable,
                } => {
                    if permit.is_none() && refundable.is_none() {
                        // Nothing to add to the response: pass it as is.
                        return fut.poll(cx);
                    }
                    let res = ready!(fut.poll(cx))?;
                    let permit = permit
                        .take()
                        .filter(|_| !*long_lived && !is_long_lived_response(&res));
                    let res = match permit {
                        Some(permit) => res.map(|b| b.with_permit(permit)),
                        None => res,
                    };
                    let tenant_denied = res.extensions().get::<TenantDenied>();
                    if let (Some(denied), Some((id, stage))) = (tenant_denied, refundable.take()) {
                        if denied.policy.id == id {
                            state.set(State::Refunding {
                                refund: Box::pin(refund(denied.policy.clone(), stage)),
                                response: Some(res),
                            });
                            continue;
                        }
                    }
                    return Poll::Ready(Ok(res));
                }
                StateProj::Answered { response } => {
                    let response = response.take();
                    return Poll::Ready(Ok(
                        response.expect("ResponseFuture polled after completion")
                    ));
                }
            }
        }
    }
}
