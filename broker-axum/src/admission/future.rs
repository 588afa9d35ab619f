//! [`ResponseFuture`]: one stage's admission of one request, then the inner call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use broker_core::{Cost, Permit};
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::acquire::{acquire, Answer};
use super::carry::Carry;
use super::charge::Charge;
use super::refund::{refunding, spawn_refund, Refund, Refunding};
use super::refusal::judge;
use crate::body::PermitBody;
use crate::policy::{Policy, Stage};

pin_project! {
    /// The response future of both stages' services: the denial, or the
    /// inner call, whose response body takes the concurrency permit along.
    /// Its error is the inner service's error.
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
        // Dropped before a handler ran: the route/service charge goes back.
        fn drop(this: Pin<&mut Self>) {
            let mut state = this.project().state;
            match state.as_mut().project() {
                StateProj::Admitting { charge, .. } => {
                    if let Some(charge) = charge.take() {
                        charge.left_unanswered.store(true, Ordering::Relaxed);
                    }
                }
                StateProj::Calling { charged, .. } => {
                    if let Some((charge, of)) = charged.take() {
                        // Drops the inner call, and the tenant stage in it.
                        state.set(State::Answering {
                            refund: None,
                            response: None,
                        });
                        if charge.left_unanswered.load(Ordering::Relaxed) {
                            spawn_refund(charge.policy.clone(), of);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// The response future of [`crate::TenantService`] (see [`ResponseFuture`]).
pub type TenantFuture<S, ReqB, ResB> = ResponseFuture<S, ReqB, ResB>;

/// The ready inner service (taken in `call`, as tower does) and the request.
type Call<S, ReqB> = Box<(S, Request<ReqB>)>;

/// The broker's answer, with the policy and tenant it was asked for.
type Asking = Pin<Box<dyn Future<Output = (Answer, Arc<Policy>, Option<String>)> + Send>>;

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // The store needs I/O: waiting for the broker's answer. `charge`:
        // the route/service charge a tenant-stage refusal gives back.
        Admitting {
            acquire: Asking,
            call: Option<Call<S, ReqB>>,
            charge: Option<Arc<Charge>>,
        },
        // Admitted; `charged` when a tenant stage follows this route/service stage.
        Calling {
            #[pin]
            call: Carry<S::Future>,
            charged: Option<(Arc<Charge>, Refund)>,
        },
        // Refused, here or by the tenant stage (then the cost goes back first).
        Answering {
            refund: Option<Refunding>,
            response: Option<Box<Response<ResB>>>,
        },
    }
}

/// What the broker's `answer` leads to: the inner call, or the refusal.
fn decide<S, ReqB, ResB>(
    policy: &Arc<Policy>,
    answer: Answer,
    tenant: Option<&str>,
    charge: Option<Arc<Charge>>,
    inner: &mut S,
    mut req: Request<ReqB>,
) -> State<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    let stage = answer.stage;
    match judge(policy, stage, answer.result, tenant) {
        Ok(permit) => {
            let of = Refund {
                stage,
                answered_here: answer.answered_here,
            };
            let charged = (stage != Stage::Tenant && policy.has_tenant_stage())
                .then(|| (Charge::put(&mut req, policy), of));
            State::Calling {
                call: Carry::call(inner, req, permit),
                charged,
            }
        }
        Err(mut response) => {
            if let Some(charge) = charge {
                charge.name_on(&mut response);
            }
            State::Answering {
                refund: None,
                response: Some(Box::new(response)),
            }
        }
    }
}

impl<S, ReqB, ResB> ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    /// Calls `inner` with `req`, no limit applying.
    pub(crate) fn pass(inner: &mut S, req: Request<ReqB>) -> Self {
        let state = State::Calling {
            call: Carry::call(inner, req, Permit::empty()),
            charged: None,
        };
        Self { state }
    }

    /// Admits `req` on `stage` (for `tenant`, if given), then calls `inner`
    /// (or a ready clone of it when the store needs I/O); a refusal gives
    /// `charge` back. Answered at once when the store needs no I/O, but a
    /// path read two ways, asked reading by reading.
    pub(crate) fn admit(
        policy: &Arc<Policy>,
        stage: Stage,
        tenant: Option<String>,
        charge: Option<Arc<Charge>>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        let key = tenant.as_deref();
        let now =
            (policy.limited(stage)).and_then(|l| l.handle.try_acquire_now(key, Cost::default()));
        let state = match now {
            Some(result) => decide(policy, Answer::new(result, stage), key, charge, inner, req),
            None => {
                let clone = inner.clone();
                let inner = std::mem::replace(inner, clone);
                let policy = policy.clone();
                State::Admitting {
                    acquire: Box::pin(async move {
                        let answer = acquire(&policy, stage, tenant.as_deref()).await;
                        (answer, policy, tenant)
                    }),
                    call: Some(Box::new((inner, req))),
                    charge,
                }
            }
        };
        Self { state }
    }
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
                StateProj::Admitting {
                    acquire,
                    call,
                    charge,
                } => {
                    let (answer, policy, tenant) = ready!(acquire.as_mut().poll(cx));
                    let (mut inner, req) = *call.take().expect(DONE);
                    let key = tenant.as_deref();
                    let next = decide(&policy, answer, key, charge.take(), &mut inner, req);
                    state.set(next);
                }
                StateProj::Calling { call, charged } => {
                    let mut res = ready!(call.poll(cx))?;
                    match charged.take() {
                        Some((charge, of)) if charge.refused_in(&mut res) => {
                            let refund = Some(refunding(charge.policy.clone(), of));
                            let response = Some(Box::new(res));
                            state.set(State::Answering { refund, response });
                        }
                        _ => return Poll::Ready(Ok(res)),
                    }
                }
                StateProj::Answering { refund, response } => {
                    if let Some(refund) = refund {
                        ready!(refund.as_mut().poll(cx));
                    }
                    return Poll::Ready(Ok(*response.take().expect(DONE)));
                }
            }
        }
    }
}
