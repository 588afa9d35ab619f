//! Store calls that take something or correct the store: finished on a task
//! of their own if the caller goes away; an unused answer gives back what it took.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `call`'s answer; dropped before it was answered, `call` runs to its end
/// on a task of its own (if a runtime is still there) and its answer is
/// dropped there. Awaited at once, it may then have reached the store.
pub(crate) fn to_its_answer<T: Send + 'static>(
    call: impl Future<Output = T> + Send + 'static,
) -> InFlight<T> {
    InFlight(Some(Box::pin(call)))
}

/// The future of [`to_its_answer`].
pub(crate) struct InFlight<T: Send + 'static>(Option<Pin<Box<dyn Future<Output = T> + Send>>>);

impl<T: Send + 'static> Future for InFlight<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut self.get_mut().0;
        // Taken out while polled: a call that panics is not run again.
        let mut call = this.take().expect("a call polled after its answer");
        let answer = call.as_mut().poll(cx);
        if answer.is_pending() {
            *this = Some(call);
        }
        answer
    }
}

impl<T: Send + 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        if let Some((call, rt)) = self
            .0
            .take()
            .zip(tokio::runtime::Handle::try_current().ok())
        {
            rt.spawn(async move { drop(call.await) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A call that panics on every poll, counting them.
    struct Panics(Arc<AtomicUsize>);

    impl Future for Panics {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("the store's call panicked");
        }
    }

    /// A call that panicked is not run again on a task of its own when the
    /// panic drops its caller: it would only panic a second time.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_panicked_is_not_run_again() {
        let polls = Arc::new(AtomicUsize::new(0));
        let call = to_its_answer(Panics(polls.clone()));
        let caller = tokio::spawn(call).await;
        assert!(caller.unwrap_err().is_panic());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);
    }
}
