//! What both stages share to admit a request: the broker's answer when
//! the store needs I/O ([`acquire`]), the refusal to answer ([`refusal`]),
//! the inner call carrying the permit ([`carry`]), the charge the stages
//! pass each other ([`charge`]) and the refund of a charge ([`refund`]).

pub(crate) mod acquire;
pub(crate) mod carry;
pub(crate) mod charge;
pub(crate) mod refund;
pub(crate) mod refusal;

use std::future::Future;
use std::pin::Pin;

use http::Request;

/// The broker's answer, asked asynchronously.
pub(crate) type AcquireFuture = Pin<Box<dyn Future<Output = acquire::Answer> + Send>>;

/// What the inner call needs once the broker has answered: a ready clone
/// of the inner service taken in `call` (as tower's services do) and the
/// request.
pub(crate) struct Call<S, ReqB> {
    pub(crate) inner: S,
    pub(crate) req: Request<ReqB>,
}

impl<S: Clone, ReqB> Call<S, ReqB> {
    /// `inner` (ready), swapped for a clone of it, with `req`.
    pub(crate) fn take_ready(inner: &mut S, req: Request<ReqB>) -> Box<Self> {
        let clone = inner.clone();
        Box::new(Self {
            inner: std::mem::replace(inner, clone),
            req,
        })
    }
}
