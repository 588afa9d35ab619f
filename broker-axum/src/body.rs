//! Response bodies. The pressure services answer with the inner service's
//! own body type, so they change neither the body nor the error type of a
//! stack: [`PermitBody`] says how that body type is built from a denial's
//! bytes and how it carries a concurrency [`Permit`]: the body is wrapped
//! in one that releases the permit when it ends, fails, or is dropped (the
//! client went away mid-response), so a slot is held exactly as long as the
//! response is being sent. [`PressureBody`] is that carrier as a body type
//! of its own; `axum::body::Body` and the boxed bodies box a leaner one
//! once. A response that holds no permit keeps its body untouched (no
//! wrapping, no allocation).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use broker_core::Permit;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};
use pin_project_lite::pin_project;

/// A response body type the pressure services can answer with: built from
/// fixed bytes (denials), and able to carry a [`Permit`] until it ends.
///
/// Implemented for `axum::body::Body`, http-body-util's [`BoxBody`] and
/// [`UnsyncBoxBody`] over [`Bytes`], and [`PressureBody`]. For any other
/// body, map the inner service's responses into one of these (e.g.
/// `ServiceBuilder::map_response_body(BodyExt::boxed)`), or implement
/// this trait: [`PermitBody::hold`] and [`PermitBody::from_bytes`]
/// ([`PermitBody::with_permit`] is provided).
pub trait PermitBody: Sized {
    /// Makes this body hold `permit` until it ends, fails or is dropped,
    /// in place (the response around it is not moved).
    fn hold(&mut self, permit: Permit);

    /// This body, holding `permit` until it ends, fails or is dropped.
    fn with_permit(mut self, permit: Permit) -> Self {
        self.hold(permit);
        self
    }

    /// A body of fixed bytes.
    fn from_bytes(bytes: Bytes) -> Self;
}

impl PermitBody for axum::body::Body {
    fn hold(&mut self, permit: Permit) {
        // The empty body put in meanwhile is a box of nothing: no
        // allocation. Boxed as the `UnsyncBoxBody<Bytes, axum::Error>`
        // axum's body is made of, so `Body::new` takes it as is (no second
        // box, no error mapping layer).
        let body = std::mem::take(self);
        *self = axum::body::Body::new(HeldBody::new(body, permit).boxed_unsync());
    }

    fn from_bytes(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }
}

impl<E> PermitBody for BoxBody<Bytes, E>
where
    E: 'static,
{
    fn hold(&mut self, permit: Permit) {
        // The default body is an empty one, a box of nothing: no allocation.
        let body = std::mem::take(self);
        *self = HeldBody::new(body, permit).boxed();
    }

    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes).map_err(|never| match never {}).boxed()
    }
}

impl<E> PermitBody for UnsyncBoxBody<Bytes, E>
where
    E: 'static,
{
    fn hold(&mut self, permit: Permit) {
        let body = std::mem::take(self);
        *self = HeldBody::new(body, permit).boxed_unsync();
    }

    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync()
    }
}

impl<B> PermitBody for PressureBody<B> {
    fn hold(&mut self, permit: Permit) {
        match self.permit {
            None => self.permit = Some(permit),
            Some(_) => self.more.push(permit),
        }
    }

    fn from_bytes(bytes: Bytes) -> Self {
        Self::fixed(bytes)
    }
}

pin_project! {
    /// A body holding one permit until it ends, fails or is dropped: what
    /// the boxed body types wrap their body in.
    struct HeldBody<B> {
        #[pin]
        inner: B,
        permit: Permit,
    }
}

impl<B> HeldBody<B> {
    fn new(inner: B, permit: Permit) -> Self {
        Self { inner, permit }
    }
}

impl<B: Body> Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &polled {
            this.permit.release();
        }
        polled
    }

    /// False while the permit is held: the server then polls once more
    /// after it has taken the last frame in (once its write buffer has
    /// room again), and that poll's end frees the slot. Freed as the last
    /// frame was handed over, the slot of a large response would be free
    /// before most of it was sent.
    #[inline]
    fn is_end_stream(&self) -> bool {
        !self.permit.is_held() && self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// A body plus the permits it holds (released when it ends, fails or is
    /// dropped), or a fixed body.
    #[derive(Debug)]
    pub struct PressureBody<B> {
        #[pin]
        inner: Option<B>,
        fixed: Option<Bytes>,
        permit: Option<Permit>,
        more: Vec<Permit>,
    }
}

impl<B> PressureBody<B> {
    /// Wraps `inner`; `permit` (if any) is released when the body ends or
    /// is dropped.
    pub fn new(inner: B, permit: Option<Permit>) -> Self {
        Self {
            inner: Some(inner),
            fixed: None,
            permit,
            more: Vec::new(),
        }
    }

    /// A body of fixed bytes (holds no permit).
    pub fn fixed(bytes: Bytes) -> Self {
        Self {
            inner: None,
            fixed: Some(bytes),
            permit: None,
            more: Vec::new(),
        }
    }

    /// Whether this body still holds a concurrency permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.as_ref().is_some_and(Permit::is_held) || !self.more.is_empty()
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
        let frame = ready!(body.poll_frame(cx));
        if let None | Some(Err(_)) = &frame {
            *this.permit = None;
            this.more.clear();
        }
        Poll::Ready(frame)
    }

    /// False while a permit is held, as for the boxed bodies' wrapper: the
    /// permits are let go by the poll that finds the end, after the server
    /// took the last frame in.
    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(b) => !self.holds_permit() && b.is_end_stream(),
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
}
