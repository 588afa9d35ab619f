//! What both stages share to admit a request: the broker's answer when
//! the store needs I/O ([`acquire`]), a request waiting for it
//! ([`waiting`]), the refusal to answer ([`refusal`]), the inner call
//! carrying the permit ([`carry`]), the charge the stages pass each other
//! ([`charge`]) and the refund of a charge ([`refund`]).

pub(crate) mod acquire;
pub(crate) mod carry;
pub(crate) mod charge;
pub(crate) mod refund;
pub(crate) mod refusal;
pub(crate) mod waiting;
