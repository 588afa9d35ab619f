//! A request waiting for the broker's answer, as both stages' futures
//! hold it: the answer's future and the call to make once it comes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::Request;

use super::acquire::{acquire, Answer};
use crate::policy::{Policy, Stage};
use crate::tenant::keys::TenantId;

/// The ready inner service (taken in `call`, as tower does) and the request.
pub(crate) struct Call<S, ReqB> {
    pub(crate) inner: S,
    pub(crate) req: Request<ReqB>,
}

/// A request of `policy` waiting for the broker's answer on a stage.
pub(crate) struct Waiting<S, ReqB> {
    acquire: Pin<Box<dyn Future<Output = Answer> + Send>>,
    call: Option<Box<Call<S, ReqB>>>,
    pub(crate) policy: Arc<Policy>,
}

impl<S: Clone, ReqB> Waiting<S, ReqB> {
    /// Asks the broker for `stage` of `policy` (for `tenant`, if given),
    /// keeping `req` and `inner` (ready), swapped for a clone of it.
    pub(crate) fn new(
        policy: &Arc<Policy>,
        stage: Stage,
        tenant: Option<TenantId>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self {
        let clone = inner.clone();
        let inner = std::mem::replace(inner, clone);
        let asked = policy.clone();
        Self {
            acquire: Box::pin(async move {
                acquire(&asked, stage, tenant.as_ref().map(TenantId::as_str)).await
            }),
            call: Some(Box::new(Call { inner, req })),
            policy: policy.clone(),
        }
    }
}

impl<S, ReqB> Waiting<S, ReqB> {
    /// The broker's answer, with the call to make; panics if polled again
    /// after it gave them, as a future polled after completion.
    pub(crate) fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<(Answer, Call<S, ReqB>)> {
        let answer = ready!(self.acquire.as_mut().poll(cx));
        let call = self.call.take();
        let call = call.expect("admission future polled after completion");
        Poll::Ready((answer, *call))
    }
}
