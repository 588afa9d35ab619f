//! The future of `try_acquire`: the call is made when the future is first
//! polled, never before, and the in-memory answer is returned by that
//! poll as it is made.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
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
    /// consumed. The [`Acquisition`] is built where the future returns it.
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

    /// The answer of one poll, or `None` if the call is still pending
    /// (then dropped). The common case, [`Call::quick`], is made in the
    /// caller's line, as the call's synchronous form makes it; else the
    /// future is polled once, out of the line, which makes the call in
    /// full.
    fn now_or_never(self) -> Option<Result<Acquisition, BrokerError>> {
        let rest = match self {
            FirstPoll::Unpolled(call) => {
                let mut permit = Permit::empty();
                if let Some(v) = call.quick(&mut permit) {
                    return Some(Ok(acquisition(v, permit)));
                }
                FirstPoll::Unpolled(call)
            }
            polled => polled,
        };
        match rest.poll_once() {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        }
    }

    /// [`FirstPoll::now_or_never`] past its common case: one poll with a
    /// waker that does nothing, out of the callers' line.
    fn poll_once(mut self) -> Poll<Result<Acquisition, BrokerError>> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(&mut self).poll(&mut cx)
    }
}

/// Declares the public future of one kind of `try_acquire` call: a
/// [`FirstPoll`] of it, with its own `now_or_never`.
macro_rules! try_acquire_future {
    ($(#[$doc:meta])* $name:ident, $call:ty, $example:literal) => {
        $(#[$doc])*
        #[must_use = "futures do nothing unless polled"]
        pub struct $name<'s>(pub(super) FirstPoll<'s, $call>);

        impl<'s> $name<'s> {
            /// The answer of one poll, or `None` if the call is still
            /// pending on its backend (the call is then dropped, as a
            /// dropped `try_acquire` is): what `futures`'
            /// `FutureExt::now_or_never` gives, which this method takes
            /// precedence over. A store that answers without I/O (the
            /// in-memory one) is asked synchronously, as
            /// `try_acquire_now` asks it, in the caller's line: no waker,
            /// no move of the future. A store that needs I/O has been sent
            /// the call when `None` comes back; use `try_acquire_now` to
            /// ask only a store that answers at once.
            ///
            /// # Panics
            ///
            /// If the future has already completed, as polling it again
            /// would.
            ///
            /// ```
            /// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
            /// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
            /// let broker = ResourceBroker::new(backend);
            /// broker.register_limit("tenants", Limits::new().rate(RateLimit::per_second(100)))?;
            #[doc = $example]
            /// match answer {
            ///     Some(answer) => println!("allowed: {}", answer?.allowed),
            ///     None => println!("the backend is asked asynchronously"),
            /// }
            /// # Ok(()) }
            /// ```
            pub fn now_or_never(self) -> Option<Result<Acquisition, BrokerError>> {
                self.0.now_or_never()
            }
        }

        impl Future for $name<'_> {
            type Output = Result<Acquisition, BrokerError>;

            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
                Pin::new(&mut self.get_mut().0).poll(cx)
            }
        }

        impl std::fmt::Debug for $name<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name)).finish_non_exhaustive()
            }
        }
    };
}

try_acquire_future!(
    /// The future of [`super::ResourceBroker::try_acquire`]: the call is
    /// made when it is first polled, never before.
    TryAcquire,
    super::ById<'s>,
    "let answer = broker.try_acquire((\"tenants\", \"acme\"), Cost::default()).now_or_never();"
);

try_acquire_future!(
    /// The future of [`super::ResourceHandle::try_acquire`]: the call is
    /// made when it is first polled, never before.
    TryAcquireOnHandle,
    super::handle::OnHandle<'s>,
    "let answer = broker.resource_handle(\"tenants\")?.try_acquire(\"acme\", Cost::default()).now_or_never();"
);

impl<'s, C: Call<'s>> Future for FirstPoll<'s, C> {
    type Output = Result<Acquisition, BrokerError>;

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
pub(super) fn acquisition(v: Verdict, permit: Permit) -> Acquisition {
    match v {
        Verdict::Allowed | Verdict::Leased(_) => Acquisition {
            allowed: true,
            wait_time: Duration::ZERO,
            denied_by: None,
            permit,
            answered_here: false,
        },
        Verdict::Rate(wait) => denied(DenyReason::Rate, wait),
        Verdict::Concurrency => denied(DenyReason::Concurrency, 0),
    }
}

/// A denied acquisition, holding nothing.
pub(super) fn denied(reason: DenyReason, wait: Micros) -> Acquisition {
    Acquisition {
        allowed: false,
        wait_time: Duration::from_micros(wait),
        denied_by: Some(reason),
        permit: Permit::empty(),
        answered_here: false,
    }
}
