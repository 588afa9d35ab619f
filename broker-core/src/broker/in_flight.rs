//! Store calls that take something or correct the store: finished on a task
//! of their own if the caller goes away; an unused answer gives back what it took.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::enqueue::LiveBooking;
use super::HeldKey;
use crate::state::Decision;

/// `call`'s answer; dropped after it was first polled and before it was
/// answered, `call` runs to its end on a task of its own (if a runtime is
/// still there) and its answer is dropped there.
pub(crate) fn to_its_answer<T: Send + 'static>(
    call: impl Future<Output = T> + Send + 'static,
) -> InFlight<T> {
    InFlight {
        call: Some(Box::pin(call)),
        sent: false,
    }
}

/// The future of [`to_its_answer`].
pub(crate) struct InFlight<T: Send + 'static> {
    call: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    /// Polled: it may have reached the store.
    sent: bool,
}

impl<T: Send + 'static> Future for InFlight<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        // Taken out while polled: a call that panics is not run again.
        let mut call = this.call.take().expect("a call polled after its answer");
        this.sent = true;
        let Poll::Ready(answer) = call.as_mut().poll(cx) else {
            this.call = Some(call);
            return Poll::Pending;
        };
        Poll::Ready(answer)
    }
}

impl<T: Send + 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        let Some(call) = self.call.take().filter(|_| self.sent) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { drop(call.await) });
        }
    }
}

/// A `try` decision for a caller that may have gone away: dropped without
/// [`Unclaimed::claim`], an allowed decision frees its slot and refunds
/// its cost (as an unused booking).
pub(crate) struct Unclaimed {
    pub(crate) decision: Option<Decision>,
    pub(crate) cost: LiveBooking,
}

impl Unclaimed {
    /// The decision, now held by its caller, and its state key.
    pub(crate) fn claim(mut self) -> (Decision, Option<String>) {
        let decision = self.decision.take().expect("claimed once");
        (decision, self.cost.claim())
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let lease = self.decision.take().filter(|d| d.allowed);
        if let Some(lease) = lease.and_then(|d| d.lease) {
            let (backend, resource) = (&self.cost.backend, self.cost.resource.clone());
            let key = HeldKey::State(self.cost.key.clone());
            super::permit::release(backend.clone(), resource, key, lease, false);
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
