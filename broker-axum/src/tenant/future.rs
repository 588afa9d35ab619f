//! The tenant stage's response future: the one both stages share.

use crate::admission::future::ResponseFuture;

/// The response future of [`crate::TenantService`] (see [`ResponseFuture`]).
pub type TenantFuture<S, ReqB, ResB> = ResponseFuture<S, ReqB, ResB>;
