//! Response bodies: [`PermitBody`] builds the inner service's body type from a
//! denial's bytes and makes it hold a concurrency [`Permit`] until it ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use broker_core::Permit;
use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};
use pin_project_lite::pin_project;

/// A body type the pressure services answer with: built from a denial's
/// bytes, able to hold a [`Permit`]. For other bodies, map them into one
/// (`ServiceBuilder::map_response_body(BodyExt::boxed)`).
///
/// ```
/// use broker_axum::PermitBody;
/// let denial = <axum::body::Body as PermitBody>::from_bytes("slow down".into());
/// assert!(denial.has_exact_length());
/// ```
pub trait PermitBody: Sized {
    /// Makes this body hold `permit` until it ends, fails or is dropped.
    fn hold(&mut self, permit: Permit);

    /// This body, holding `permit` until it ends, fails or is dropped.
    fn with_permit(mut self, permit: Permit) -> Self {
        self.hold(permit);
        self
    }

    /// A body of fixed bytes.
    fn from_bytes(bytes: Bytes) -> Self;

    /// Whether the length is known up front (then the response holds its
    /// slot to the end whatever its content type).
    fn has_exact_length(&self) -> bool {
        false
    }
}

impl PermitBody for axum::body::Body {
    fn hold(&mut self, permit: Permit) {
        let body = std::mem::take(self);
        *self = axum::body::Body::new(PressureBody::new(body, Some(permit)).boxed_unsync());
    }

    fn from_bytes(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }

    fn has_exact_length(&self) -> bool {
        Body::size_hint(self).exact().is_some()
    }
}

/// [`PermitBody`] for a boxed body type, boxed again with `$boxed`.
macro_rules! boxed_permit_body {
    ($body:ident, $boxed:ident) => {
        impl<E: 'static> PermitBody for $body<Bytes, E> {
            fn hold(&mut self, permit: Permit) {
                let body = std::mem::take(self);
                *self = PressureBody::new(body, Some(permit)).$boxed();
            }

            fn from_bytes(bytes: Bytes) -> Self {
                Full::new(bytes).map_err(|never| match never {}).$boxed()
            }

            fn has_exact_length(&self) -> bool {
                self.size_hint().exact().is_some()
            }
        }
    };
}

boxed_permit_body!(BoxBody, boxed);
boxed_permit_body!(UnsyncBoxBody, boxed_unsync);

impl<B: Body> PermitBody for PressureBody<B> {
    fn hold(&mut self, permit: Permit) {
        self.permit = std::mem::take(&mut self.permit).join(permit);
    }

    fn from_bytes(bytes: Bytes) -> Self {
        Self::fixed(bytes)
    }

    fn has_exact_length(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|b| b.size_hint().exact().is_some())
    }
}

/// Bodies up to this size may end with their last frame ([`may_end`]).
const SMALL_BODY: usize = 16 << 10;

/// Whether a body reports its end with its last frame (then the server drops
/// it); a larger permit-holding body waits one more poll, so its slot is not
/// freed before most of it is sent.
fn may_end(inner_ended: bool, held: bool, handed: usize) -> bool {
    inner_ended && (!held || handed <= SMALL_BODY)
}

/// The data bytes of `frame`, if polled.
fn data_len<D: Buf, E>(frame: &Poll<Option<Result<Frame<D>, E>>>) -> usize {
    match frame {
        Poll::Ready(Some(Ok(f))) => f.data_ref().map_or(0, Buf::remaining),
        _ => 0,
    }
}

pin_project! {
    /// A body holding permits until it ends, fails or is dropped; or fixed bytes.
    ///
    /// ```
    /// use broker_axum::PressureBody;
    /// let b: PressureBody<String> = PressureBody::fixed("no".into());
    /// assert!(!b.holds_permit());
    /// ```
    #[derive(Debug)]
    pub struct PressureBody<B> {
        #[pin]
        inner: Option<B>,
        fixed: Option<Bytes>,
        permit: Permit,
        // Data bytes handed to the server so far (see `may_end`).
        handed: usize,
    }
}

impl<B> PressureBody<B> {
    /// Wraps `inner`, holding `permit` (if any).
    pub fn new(inner: B, permit: Option<Permit>) -> Self {
        Self {
            inner: Some(inner),
            fixed: None,
            permit: permit.unwrap_or_default(),
            handed: 0,
        }
    }

    /// A body of fixed bytes (holds no permit).
    pub fn fixed(bytes: Bytes) -> Self {
        Self {
            inner: None,
            fixed: Some(bytes),
            permit: Permit::empty(),
            handed: 0,
        }
    }

    /// Whether this body still holds a concurrency permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_held()
    }
}

impl<B> Body for PressureBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let mut inner = this.inner;
        let Some(body) = inner.as_mut().as_pin_mut() else {
            return Poll::Ready(this.fixed.take().map(|b| Ok(Frame::data(B::Data::from(b)))));
        };
        let frame = body.poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &frame {
            this.permit.release();
        }
        *this.handed = this.handed.saturating_add(data_len(&frame));
        frame
    }

    /// Whether the body has ended; a large body holding a slot waits one more poll.
    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(b) => may_end(b.is_end_stream(), self.holds_permit(), self.handed),
            None => self.fixed.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.fixed) {
            (Some(b), _) => b.size_hint(),
            (None, Some(f)) => SizeHint::with_exact(f.len() as u64),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fixed_body_yields_its_bytes_once() {
        let body: PressureBody<String> = PressureBody::fixed(Bytes::from_static(b"no"));
        assert_eq!(body.size_hint().exact(), Some(2));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"no");
    }

    #[tokio::test]
    async fn wrapped_body_passes_frames_through() {
        let body = PressureBody::new(Full::new(Bytes::from_static(b"ok")), None);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"ok");
    }

    #[tokio::test]
    async fn permit_carrying_bodies_pass_frames_through() {
        let body = axum::body::Body::from("ok").with_permit(Permit::empty());
        assert_eq!(body.size_hint().exact(), Some(2));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
        let body: BoxBody<Bytes, std::convert::Infallible> =
            PermitBody::from_bytes(Bytes::from_static(b"x"));
        let body = body.with_permit(Permit::empty());
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"x");
    }

    #[tokio::test]
    async fn boxed_bodies_are_built_from_denial_bytes() {
        let body: BoxBody<Bytes, std::io::Error> = PermitBody::from_bytes(Bytes::from_static(b"x"));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"x");
        let body: UnsyncBoxBody<Bytes, std::io::Error> =
            PermitBody::from_bytes(Bytes::from_static(b"y"));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"y");
    }

    #[tokio::test]
    async fn only_a_small_body_ends_with_its_last_frame() {
        use broker_core::{Cost, Limits, ResourceBroker};
        let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
        broker
            .register_limit("r", Limits::new().max_concurrent(2))
            .unwrap();
        let in_flight = || broker.stats().resources["r"].in_flight;
        let permit = || async {
            let a = broker.try_acquire("r", Cost::default()).await.unwrap();
            assert!(a.permit.is_held());
            a.permit
        };

        let body = axum::body::Body::from(vec![b'x'; SMALL_BODY]);
        let mut small = body.with_permit(permit().await);
        assert!(!small.is_end_stream());
        assert!(small.frame().await.unwrap().unwrap().is_data());
        assert!(small.is_end_stream(), "all of a small body was handed over");
        assert_eq!(in_flight(), 1, "held until the server drops the body");
        drop(small);
        assert_eq!(in_flight(), 0);

        let body = axum::body::Body::from(vec![b'x'; SMALL_BODY + 1]);
        let mut large = body.with_permit(permit().await);
        assert!(large.frame().await.unwrap().unwrap().is_data());
        assert!(!large.is_end_stream(), "a large body ends one poll later");
        assert!(large.frame().await.is_none());
        assert!(large.is_end_stream());
        assert_eq!(in_flight(), 0, "the poll that found the end let go");

        let mut own = PressureBody::new(Full::new(Bytes::from_static(b"ok")), None);
        own.hold(permit().await);
        assert!(own.frame().await.unwrap().unwrap().is_data());
        assert!(own.is_end_stream());
        let mut own = PressureBody::new(Full::new(Bytes::from(vec![0; SMALL_BODY + 1])), None);
        own.hold(permit().await);
        assert!(own.frame().await.unwrap().unwrap().is_data());
        assert!(!own.is_end_stream());
        assert_eq!(in_flight(), 2);
    }
}
