//! Store calls that take something when answered (a cost, a booking, a
//! slot) or correct the store (a 429's penalty): run to their answer on a
//! task of their own when the caller goes away while they are in flight,
//! and an answer that took something gives it back when dropped unused.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::enqueue::{refund_spec, settle_or_spawn, NO_COST};
use super::permit::release_untold;
use super::{HeldKey, Resource};
use crate::limits::Cost;
use crate::state::{Decision, Marks};
use crate::store::Store;

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
/// [`Unclaimed::claim`], an allowed decision frees its slot and gives its
/// cost back, unless a penalty was put on since it was asked or a
/// registration since had other buckets.
pub(crate) struct Unclaimed {
    pub(crate) decision: Option<Decision>,
    pub(crate) backend: Arc<dyn Store>,
    pub(crate) resource: Arc<Resource>,
    /// The state asked (`None`: the resource's own).
    pub(crate) key: Option<String>,
    pub(crate) cost: Cost,
    /// This process's penalty on the state when it was asked.
    pub(crate) penalty_end: Option<tokio::time::Instant>,
}

impl Unclaimed {
    /// The decision, now held by its caller, and its state key.
    pub(crate) fn claim(mut self) -> (Decision, Option<String>) {
        let decision = self.decision.take().expect("claimed once");
        (decision, self.key.take())
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(d) = self.decision.take().filter(|d| d.allowed) else {
            return;
        };
        let resource = &self.resource;
        if let Some(lease) = d.lease {
            let key = HeldKey::State(self.key.clone());
            release_untold(&self.backend, resource.clone(), key, lease);
        }
        let key = self.key.as_deref().unwrap_or(&resource.key);
        let held = resource.penalties.until(key);
        if self.cost == NO_COST || held.is_some_and(|h| Some(h) > self.penalty_end) {
            return;
        }
        let Some(spec) = refund_spec(resource) else {
            return;
        };
        let since = d.answered_here.then_some(Marks::ANSWERED_HERE);
        let change = (self.cost, NO_COST, since);
        let _ = settle_or_spawn(&self.backend, resource, key, &spec, change, "refund");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A call that panics on every poll, counting them.
    struct Panics(Arc<AtomicUsize>);

    impl Future for Panics {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("the store's call panicked");
        }
    }

    /// A call that panicked is not run again when its caller's task is
    /// dropped by the panic: polled again on a task of its own, it would
    /// only panic a second time (or, for an `async` block, report that it
    /// was resumed after panicking).
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
