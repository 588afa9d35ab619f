//! A call to the store that takes something when it is answered (a cost,
//! a booking), run to its answer when its caller goes away while it is in
//! flight (a timeout around `try_acquire`, `acquire` or `enqueue`, a
//! dropped request): the store decides it anyway once it has it, and
//! cut off, what it took would stay taken for work that never goes out.
//! Run to its end on a task of its own, its answer is dropped there,
//! and an answer that took something gives it back when dropped unused
//! (a [`super::enqueue::LiveBooking`] refunds its cost, an [`Unclaimed`]
//! decision its cost and its slot, an [`UntoldLease`] its slot). A
//! correction of the store (a 429's penalty) runs to its end the same way.
//!
//! A store that answers in process answers on the first poll: nothing is
//! ever left in flight there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::enqueue::{refund_spec, settle_or_spawn, NO_COST};
use super::permit::release_untold;
use super::{HeldKey, Resource};
use crate::limits::Cost;
use crate::state::{Decision, LeaseId, Marks};
use crate::store::Store;

/// `call`'s answer; if the caller goes away after it was first polled
/// (sent) and before it was answered, `call` is run to its end on a task
/// of its own, and its answer dropped there. Without a runtime (it is
/// shutting down), it is dropped where it is.
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
    /// The call, until it is answered.
    call: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    /// Whether it was polled: it may have reached the store.
    sent: bool,
}

impl<T: Send + 'static> Future for InFlight<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        // Out of its place while polled: a call that panics is dropped as
        // the panic unwinds, not run again on a task of its own (polled
        // after its panic, it would only panic again there).
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

/// A `try` decision of the store for a caller that may have gone away
/// before it was told: dropped without [`Unclaimed::claim`], an allowed
/// decision gives its cost back and frees its slot, as a permit dropped
/// unused would (its cost is not given back if a penalty was put on since
/// it was asked: then the store's drain stands, as a cancelled booking's
/// does; nor if a registration since had other buckets: then the state
/// may have been started afresh).
pub(crate) struct Unclaimed {
    decision: Option<Decision>,
    backend: Arc<dyn Store>,
    resource: Arc<Resource>,
    /// The state asked (`None`: the resource's own).
    key: Option<String>,
    cost: Cost,
    /// The end of this process's penalty on the state when it was asked.
    penalty_end: Option<tokio::time::Instant>,
}

impl Unclaimed {
    /// `decision` on state `key` (`None`: the resource's own), asked for
    /// `cost`.
    pub(crate) fn new(
        decision: Decision,
        backend: Arc<dyn Store>,
        resource: Arc<Resource>,
        key: Option<String>,
        cost: Cost,
        penalty_end: Option<tokio::time::Instant>,
    ) -> Self {
        Self {
            decision: Some(decision),
            backend,
            resource,
            key,
            cost,
            penalty_end,
        }
    }

    /// The decision, told to its caller (which now holds what it took),
    /// and the state key it was made on.
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
        // Under the latest limits, none if a registration since the call
        // was asked had other buckets (see `refund_spec`).
        let Some(spec) = refund_spec(resource) else {
            return;
        };
        let since = d.answered_here.then_some(Marks::ANSWERED_HERE);
        let change = (self.cost, NO_COST, since);
        let _ = settle_or_spawn(&self.backend, resource, key, &spec, change, "refund");
    }
}

/// A lease `take_slot` took on state `key` for a caller that may have
/// gone away before it was told: dropped without [`UntoldLease::claim`],
/// it is released, as a permit dropped unused would be.
pub(crate) struct UntoldLease {
    lease: Option<LeaseId>,
    backend: Arc<dyn Store>,
    resource: Arc<Resource>,
    key: String,
}

impl UntoldLease {
    /// `lease`, held on state `key` of `resource`.
    pub(crate) fn new(
        lease: LeaseId,
        backend: Arc<dyn Store>,
        resource: Arc<Resource>,
        key: String,
    ) -> Self {
        Self {
            lease: Some(lease),
            backend,
            resource,
            key,
        }
    }

    /// The lease, told to its caller (which now holds it).
    pub(crate) fn claim(mut self) -> LeaseId {
        self.lease.take().expect("claimed once")
    }
}

impl Drop for UntoldLease {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let key = HeldKey::State(Some(std::mem::take(&mut self.key)));
        release_untold(&self.backend, self.resource.clone(), key, lease);
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
