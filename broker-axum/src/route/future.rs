//! [`ResponseFuture`]: the route/service stage's admission of one request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use broker_core::Permit;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use crate::admission::acquire::Answer;
use crate::admission::carry::Carry;
use crate::admission::charge::Charge;
use crate::admission::refund::{spawn_refund, Refund, Refunding};
use crate::admission::refusal::{judge, respond_once, Refusal};
use crate::admission::waiting::{Call, Waiting};
use crate::body::PermitBody;
use crate::policy::{Policy, Stage};

pin_project! {
    /// The response future of [`crate::PressureService`]: the denial, or
    /// the inner call, whose response body takes the concurrency permit
    /// along. Its error is the inner service's error.
    pub struct ResponseFuture<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        #[pin]
        state: State<S, ReqB, ResB>,
    }
    impl<S, ReqB, ResB> PinnedDrop for ResponseFuture<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // The client left: if the tenant stage inside was still deciding,
        // no handler ran, so the charge goes back.
        fn drop(this: Pin<&mut Self>) {
            let mut state = this.project().state;
            if let StateProj::Calling { charged, .. } = state.as_mut().project() {
                if let Some((charge, of)) = charged.take() {
                    // Drops the inner call, and the tenant stage in it.
                    state.set(State::Refused { refusal: None });
                    if charge.was_left_unanswered() {
                        spawn_refund(charge.policy().clone(), of);
                    }
                }
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // The store needs I/O: waiting for the broker's answer.
        Admitting {
            waiting: Waiting<S, ReqB>,
        },
        // Admitted; `charged` when a tenant stage follows.
        Calling {
            #[pin]
            call: Carry<S::Future>,
            charged: Option<(Arc<Charge>, Refund)>,
        },
        // The tenant stage refused: the cost goes back, then the refusal.
        Refunding {
            refund: Refunding,
            response: Option<Box<Response<ResB>>>,
        },
        Refused {
            refusal: Option<Refusal>,
        },
    }
}

/// The inner call of an admitted request, charged when a tenant stage follows.
fn calling<S, ReqB, ResB>(
    policy: &Arc<Policy>,
    of: Refund,
    permit: Permit,
    inner: &mut S,
    mut req: Request<ReqB>,
) -> State<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let charged = (policy.has_tenant_stage()).then(|| (Charge::put(&mut req, policy), of));
    State::Calling {
        call: Carry::call(inner, req, permit),
        charged,
    }
}

impl<S, ReqB, ResB> ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    /// The inner call, untouched (no limit applies to it).
    pub(crate) fn pass(fut: S::Future) -> Self {
        let state = State::Calling {
            call: Carry::new(fut, Permit::empty(), &http::Method::GET),
            charged: None,
        };
        Self { state }
    }

    /// Calls `inner` with `req`, admitted on `of`, the response taking
    /// `permit` along.
    pub(crate) fn admitted(
        policy: &Arc<Policy>,
        of: Refund,
        permit: Permit,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self {
        let state = calling(policy, of, permit, inner, req);
        Self { state }
    }

    /// Answers `refusal` when polled.
    pub(crate) fn refused(refusal: Refusal) -> Self {
        let refusal = Some(refusal);
        Self {
            state: State::Refused { refusal },
        }
    }

    /// Admits `req` on `stage` once the broker has answered, then calls
    /// a ready clone of `inner`.
    pub(crate) fn admit_later(
        policy: &Arc<Policy>,
        stage: Stage,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        let waiting = Waiting::new(policy, stage, None, inner, req);
        Self {
            state: State::Admitting { waiting },
        }
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
                StateProj::Calling { call, charged } => {
                    let out = ready!(call.poll(cx));
                    let Some((charge, of)) = charged.take() else {
                        return Poll::Ready(out);
                    };
                    let mut res = match out {
                        Ok(res) => res,
                        Err(e) => return Poll::Ready(Err(e)),
                    };
                    if !charge.refused_in(&mut res) {
                        return Poll::Ready(Ok(res));
                    }
                    let refund = Refunding::new(charge.policy().clone(), of);
                    let response = Some(Box::new(res));
                    state.set(State::Refunding { refund, response });
                }
                StateProj::Admitting { waiting } => {
                    let (answer, call) = ready!(waiting.poll_answer(cx));
                    let Answer {
                        result,
                        stage,
                        answered_here,
                    } = answer;
                    let Call { mut inner, req } = call;
                    let policy = waiting.policy.clone();
                    let next = match judge(&policy, stage, result, None) {
                        Ok(permit) => {
                            let of = Refund {
                                stage,
                                answered_here,
                            };
                            calling(&policy, of, permit, &mut inner, req)
                        }
                        Err(refusal) => State::Refused {
                            refusal: Some(refusal),
                        },
                    };
                    state.set(next);
                }
                StateProj::Refunding { refund, response } => {
                    ready!(Pin::new(refund).poll(cx));
                    let response = response.take();
                    let response = response.expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(*response));
                }
                StateProj::Refused { refusal } => return Poll::Ready(Ok(respond_once(refusal))),
            }
        }
    }
}
