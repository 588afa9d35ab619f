//! What both stages share to admit a request.

pub(crate) mod acquire;
pub(crate) mod carry;
pub(crate) mod charge;
pub(crate) mod future;
pub(crate) mod refund;
pub(crate) mod refusal;
