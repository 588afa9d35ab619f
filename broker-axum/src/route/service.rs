//! [`PressureService`]: the route/service stage, before authentication.

use std::sync::Arc;
use std::task::{Context, Poll};

use broker_core::Cost;
use http::{Request, Response};
use tower::Service;

use super::future::ResponseFuture;
use crate::admission::refund::{answered_here, Refund};
use crate::admission::refusal::judge;
use crate::body::PermitBody;
use crate::policy::{Policy, Stage};

/// The route/service stage: the longest matching route's resource, else the
/// service's. Built by [`crate::Pressure::layer`].
#[derive(Debug, Clone)]
pub struct PressureService<S> {
    inner: S,
    policy: Arc<Policy>,
}

impl<S> PressureService<S> {
    pub(crate) fn new(inner: S, policy: Arc<Policy>) -> Self {
        Self { inner, policy }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for PressureService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: PermitBody,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let policy = &self.policy;
        let Some((stage, limited)) = policy.stage_for(req.uri().path()) else {
            return ResponseFuture::pass(self.inner.call(req));
        };
        // A path read two ways is asked reading by reading; any other is
        // answered at once when the store needs no I/O.
        let now = match stage {
            Stage::Both(..) => None,
            _ => limited.handle.try_acquire_now(None, Cost::default()),
        };
        let Some(result) = now else {
            return ResponseFuture::admit_later(policy, stage, &mut self.inner, req);
        };
        let answered_here = answered_here(&result);
        match judge(policy, stage, result, None) {
            Ok(permit) => {
                let of = Refund {
                    stage,
                    answered_here,
                };
                ResponseFuture::admitted(policy, of, permit, &mut self.inner, req)
            }
            Err(refusal) => ResponseFuture::refused(refusal),
        }
    }
}
