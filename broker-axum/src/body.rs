//! [`PressureBody`]: the response body of the pressure services. It carries
//! the concurrency [`Permit`] of the request and releases it when the body
//! ends, fails, or is dropped (the client went away mid-response), so a
//! slot is held exactly as long as the response is being sent. Denials use
//! the same type with a fixed body, so the layer changes no error type and
//! composes with any body whose data is built from [`Bytes`].

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use broker_core::Permit;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The inner service's body plus the permit it holds, or a fixed body
    /// (a denial).
    #[derive(Debug)]
    pub struct PressureBody<B> {
        #[pin]
        inner: Option<B>,
        fixed: Option<Bytes>,
        permit: Option<Permit>,
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
        }
    }

    /// A body of fixed bytes (holds no permit).
    pub fn fixed(bytes: Bytes) -> Self {
        Self {
            inner: None,
            fixed: Some(bytes),
            permit: None,
        }
    }

    /// Whether this body still holds a concurrency permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.as_ref().is_some_and(Permit::is_held)
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
        let finished = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => inner
                .as_ref()
                .as_pin_ref()
                .is_none_or(|b| b.is_end_stream()),
        };
        if finished {
            *this.permit = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(b) => b.is_end_stream(),
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
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn fixed_body_yields_its_bytes_once() {
        let body: PressureBody<String> = PressureBody::fixed(Bytes::from_static(b"no"));
        assert_eq!(body.size_hint().exact(), Some(2));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"no");
    }

    #[tokio::test]
    async fn wrapped_body_passes_frames_through() {
        let body = PressureBody::new(http_body_util::Full::new(Bytes::from_static(b"ok")), None);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"ok");
    }
}
