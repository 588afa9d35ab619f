//! Store calls that take something or correct the store: finished on a task
//! of their own if the caller goes away; an unused answer gives back what it took.

use std::future::Future;

/// `call`'s answer; dropped after it was first polled and before it was
/// answered, `call` runs to its end on a task of its own (if a runtime is
/// still there) and its answer is dropped there.
pub(crate) async fn to_its_answer<T: Send + 'static>(
    call: impl Future<Output = T> + Send + 'static,
) -> T {
    let mut call = scopeguard::guard(Some(Box::pin(call)), |call| {
        if let Some((call, rt)) = call.zip(tokio::runtime::Handle::try_current().ok()) {
            rt.spawn(async move { drop(call.await) });
        }
    });
    std::future::poll_fn(|cx| {
        // Taken out while polled: a call that panics is not run again.
        let mut polled = call.take().expect("a call polled after its answer");
        let answer = polled.as_mut().poll(cx);
        if answer.is_pending() {
            *call = Some(polled);
        }
        answer
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

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
