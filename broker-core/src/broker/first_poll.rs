//! The future of `try_acquire`: the call is made when the future is first
//! polled, never before, and the in-memory answer is returned by that
//! poll as it is made.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{Acquisition, Permit};
use crate::clock::Micros;
use crate::error::BrokerError;
use crate::state::{DenyReason, Verdict};

/// The asynchronous rest of a call whose first poll could not answer.
pub(super) type Later<'s> =
    Pin<Box<dyn Future<Output = Result<Acquisition, BrokerError>> + Send + 's>>;

/// A `try_acquire` call, as its future holds it until the first poll.
pub(super) trait Call<'s>: Send + Unpin + 's {
    /// The verdict made without I/O, counted, when the common case applies
    /// (a store that answers in process, a cost that fits), with the slot
    /// of a [`Verdict::Leased`] put in `permit`; else `None`, with nothing
    /// consumed. Two words wide, it comes back in registers, and the
    /// [`Acquisition`] is built once, where the future returns it.
    fn quick(&self, permit: &mut Permit) -> Option<Verdict>;

    /// The call in full: the answer, or the call to poll from then on.
    fn start(self) -> Result<Result<Acquisition, BrokerError>, Later<'s>>;
}

/// The future of a [`Call`]: [`Call::quick`] on the first poll, whose
/// answer that poll returns with no state machine to move it through
/// (which is what keeps the in-memory answer cheap), else
/// [`Call::start`].
pub(super) enum FirstPoll<'s, C> {
    /// Not polled yet.
    Unpolled(C),
    /// Waiting for the backend.
    Later(Later<'s>),
    /// Answered.
    Done,
}

impl<'s, C: Call<'s>> FirstPoll<'s, C> {
    pub(super) fn new(call: C) -> Self {
        Self::Unpolled(call)
    }
}

impl<'s, C: Call<'s>> Future for FirstPoll<'s, C> {
    type Output = Result<Acquisition, BrokerError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let FirstPoll::Unpolled(call) = &*this {
            let mut permit = Permit::empty();
            if let Some(v) = call.quick(&mut permit) {
                *this = FirstPoll::Done;
                return Poll::Ready(Ok(acquisition(v, permit)));
            }
        }
        let mut later = match std::mem::replace(this, FirstPoll::Done) {
            FirstPoll::Unpolled(call) => match call.start() {
                Ok(answer) => return Poll::Ready(answer),
                Err(later) => later,
            },
            FirstPoll::Later(later) => later,
            FirstPoll::Done => panic!("`try_acquire` polled after it completed"),
        };
        let polled = later.as_mut().poll(cx);
        if polled.is_pending() {
            *this = FirstPoll::Later(later);
        }
        polled
    }
}

/// The acquisition of verdict `v`, already counted, with `permit` (the
/// slot of a [`Verdict::Leased`], else empty).
#[inline(always)]
pub(super) fn acquisition(v: Verdict, permit: Permit) -> Acquisition {
    match v {
        Verdict::Allowed | Verdict::Leased(_) => Acquisition {
            allowed: true,
            wait_time: Duration::ZERO,
            denied_by: None,
            permit,
        },
        Verdict::Rate(wait) => denied(DenyReason::Rate, wait),
        Verdict::Concurrency => denied(DenyReason::Concurrency, 0),
    }
}

/// A denied acquisition, holding nothing.
#[inline]
pub(super) fn denied(reason: DenyReason, wait: Micros) -> Acquisition {
    Acquisition {
        allowed: false,
        wait_time: Duration::from_micros(wait),
        denied_by: Some(reason),
        permit: Permit::empty(),
    }
}
