//! [`PressureService`]: the longest matching route's resource, else the service's.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use crate::admission::ResponseFuture;
use crate::body::PermitBody;
use crate::policy::Policy;

/// The route/service stage: the longest matching route's resource, else the
/// service's. Built by [`crate::Pressure::layer`].
#[derive(Debug, Clone)]
pub struct PressureService<S> {
    pub(crate) inner: S,
    pub(crate) policy: Arc<Policy>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for PressureService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: PermitBody + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let stage = self.policy.stage_for(req.uri().path());
        ResponseFuture::admit(&self.policy, stage, None, None, &mut self.inner, req)
    }
}
