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

/// A body the pressure services answer with: built from a denial's bytes,
/// able to hold a [`Permit`]. Map other bodies into one
/// (`ServiceBuilder::map_response_body(BodyExt::boxed)`).
///
/// ```
/// use broker_axum::PermitBody;
/// let denial = <axum::body::Body as PermitBody>::from_bytes("slow down".into());
/// assert!(http_body::Body::size_hint(&denial).exact().is_some());
/// ```
pub trait PermitBody: Body + Sized {
    /// Makes this body hold `permit` until it ends, fails or is dropped.
    fn hold(&mut self, permit: Permit);

    /// A body of fixed bytes.
    fn from_bytes(bytes: Bytes) -> Self;
}

/// [`PermitBody`] for a boxed body type of error `$err`, boxed with `$boxed`.
macro_rules! permit_body {
    ($(impl$(<$e:ident>)? for $body:ty => $boxed:path, $err:ty;)*) => {$(
        impl$(<$e: 'static>)? PermitBody for $body {
            fn hold(&mut self, permit: Permit) {
                let inner = std::mem::take(self);
                *self = $boxed(Holding { inner, permit, handed: 0 });
            }

            fn from_bytes(bytes: Bytes) -> Self {
                $boxed(Full::new(bytes).map_err(|never| -> $err { match never {} }))
            }
        }
    )*};
}

permit_body! {
    impl for axum::body::Body => axum::body::Body::new, axum::Error;
    impl<E> for BoxBody<Bytes, E> => BodyExt::boxed, E;
    impl<E> for UnsyncBoxBody<Bytes, E> => BodyExt::boxed_unsync, E;
}

/// Bodies up to this size may end with their last frame (see
/// [`Holding::is_end_stream`]).
const SMALL_BODY: usize = 16 << 10;

pin_project! {
    /// A body holding a permit until it ends, fails or is dropped.
    struct Holding<B> {
        #[pin]
        inner: B,
        permit: Permit,
        // Data bytes handed to the server so far.
        handed: usize,
    }
}

impl<B: Body> Body for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        match &frame {
            Poll::Ready(Some(Ok(f))) => {
                let len = f.data_ref().map_or(0, Buf::remaining);
                *this.handed = this.handed.saturating_add(len);
            }
            Poll::Ready(_) => this.permit.release(),
            Poll::Pending => {}
        }
        frame
    }

    /// Whether the body has ended (then the server drops it): a larger body
    /// holding a slot waits one more poll, so its slot is not freed before
    /// most of it is sent.
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && (!self.permit.is_held() || self.handed <= SMALL_BODY)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn permit_carrying_bodies_pass_frames_through() {
        let body = Holding {
            inner: Full::new(Bytes::from_static(b"ok")),
            permit: Permit::empty(),
            handed: 0,
        };
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
        let mut body = axum::body::Body::from("ok");
        body.hold(Permit::empty());
        assert_eq!(body.size_hint().exact(), Some(2));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
        let mut body: BoxBody<Bytes, std::convert::Infallible> =
            PermitBody::from_bytes(Bytes::from_static(b"x"));
        body.hold(Permit::empty());
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

        let mut small = axum::body::Body::from(vec![b'x'; SMALL_BODY]);
        small.hold(permit().await);
        assert!(!small.is_end_stream());
        assert!(small.frame().await.unwrap().unwrap().is_data());
        assert!(small.is_end_stream(), "all of a small body was handed over");
        assert_eq!(in_flight(), 1, "held until the server drops the body");
        drop(small);
        assert_eq!(in_flight(), 0);

        let mut large = axum::body::Body::from(vec![b'x'; SMALL_BODY + 1]);
        large.hold(permit().await);
        assert!(large.frame().await.unwrap().unwrap().is_data());
        assert!(!large.is_end_stream(), "a large body ends one poll later");
        assert!(large.frame().await.is_none());
        assert!(large.is_end_stream());
        assert_eq!(in_flight(), 0, "the poll that found the end let go");

        let own = |n: usize, permit| Holding {
            inner: Full::new(Bytes::from(vec![0; n])),
            permit,
            handed: 0,
        };
        let mut small = own(2, permit().await);
        assert!(small.frame().await.unwrap().unwrap().is_data());
        assert!(small.is_end_stream());
        let mut large = own(SMALL_BODY + 1, permit().await);
        assert!(large.frame().await.unwrap().unwrap().is_data());
        assert!(!large.is_end_stream());
        assert_eq!(in_flight(), 2);
    }
}
