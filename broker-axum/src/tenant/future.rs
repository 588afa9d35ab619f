//! [`TenantFuture`]: the tenant stage's admission of one request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use broker_core::Permit;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::keys::TenantId;
use crate::admission::acquire::Answer;
use crate::admission::carry::Carry;
use crate::admission::charge::Charge;
use crate::admission::refusal::{judge, respond_once, Refusal};
use crate::admission::waiting::{Call, Waiting};
use crate::body::PermitBody;
use crate::policy::{Policy, Stage};

pin_project! {
    /// The response future of [`crate::TenantService`]: the denial, or the
    /// inner call with the permit in its body.
    pub struct TenantFuture<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        #[pin]
        state: State<S, ReqB, ResB>,
    }
    impl<S, ReqB, ResB> PinnedDrop for TenantFuture<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // Dropped undecided: no handler ran, so the charge goes back.
        fn drop(this: Pin<&mut Self>) {
            if let StateProj::Admitting { charge, .. } = this.project().state.project() {
                if let Some(charge) = charge.take() {
                    charge.left_unanswered();
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
            tenant: TenantId,
            charge: Option<Arc<Charge>>,
        },
        Calling {
            #[pin]
            call: Carry<S::Future>,
        },
        Refused {
            refusal: Option<Refusal>,
        },
    }
}

impl<S, ReqB, ResB> TenantFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    /// Calls `inner` with `req`, the response taking `permit` along.
    pub(crate) fn admitted(permit: Permit, inner: &mut S, req: Request<ReqB>) -> Self {
        let call = Carry::call(inner, req, permit);
        Self {
            state: State::Calling { call },
        }
    }

    /// Answers `refusal` when polled.
    pub(crate) fn refused(refusal: Refusal) -> Self {
        let refusal = Some(refusal);
        Self {
            state: State::Refused { refusal },
        }
    }

    /// Admits `req` for `tenant` once the broker has answered, then calls
    /// a ready clone of `inner`; a refusal gives `charge` back.
    pub(crate) fn admit_later(
        policy: &Arc<Policy>,
        tenant: TenantId,
        charge: Option<Arc<Charge>>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        let waiting = Waiting::new(policy, Stage::Tenant, Some(tenant), inner, req);
        Self {
            state: State::Admitting {
                waiting,
                tenant,
                charge,
            },
        }
    }
}

impl<S, ReqB, ResB> Future for TenantFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Calling { call } => return call.poll(cx),
                StateProj::Admitting {
                    waiting,
                    tenant,
                    charge,
                } => {
                    let (Answer { result, .. }, call) = ready!(waiting.poll_answer(cx));
                    let charge = charge.take();
                    let Call { mut inner, req } = call;
                    let key = Some(tenant.as_str());
                    let next = match judge(&waiting.policy, Stage::Tenant, result, key) {
                        Ok(permit) => State::Calling {
                            call: Carry::call(&mut inner, req, permit),
                        },
                        Err(refusal) => State::Refused {
                            refusal: Some(refusal.giving_back(charge)),
                        },
                    };
                    state.set(next);
                }
                StateProj::Refused { refusal } => return Poll::Ready(Ok(respond_once(refusal))),
            }
        }
    }
}
