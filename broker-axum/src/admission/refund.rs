//! Giving a route/service stage its cost back (`settle` to zero) when the
//! request never reaches its handler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use broker_core::{Acquisition, BrokerError, Cost, Marks};

use crate::policy::{Policy, Stage};

/// Where one route/service admission was charged; bit `i` of
/// `answered_here` is set when the failure policy answered part `i`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refund {
    pub(crate) stage: Stage,
    pub(crate) answered_here: u8,
}

/// `1` when the store's failure policy answered `result`.
pub(crate) fn answered_here(result: &Result<Acquisition, BrokerError>) -> u8 {
    result.as_ref().map_or(0, |a| u8::from(a.answered_here))
}

/// Gives each part of `refund.stage` its cost back where it was charged; a
/// failed refund leaves it charged.
pub(crate) async fn refund(policy: Arc<Policy>, refund: Refund) {
    for (i, stage) in refund.stage.parts().enumerate() {
        let Some(limited) = policy.limited(stage) else {
            continue;
        };
        let since = (refund.answered_here >> i & 1 == 1).then_some(Marks::ANSWERED_HERE);
        let _ = (policy.broker)
            .settle_since(&*limited.id, Cost::default(), Cost::requests(0), since)
            .await;
    }
}

/// Spawns [`refund`] on the current runtime; without one the cost stays charged.
pub(crate) fn spawn_refund(policy: Arc<Policy>, of: Refund) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(refund(policy, of));
    }
}

/// A refund that runs to its end even if dropped: polled in place, moved to
/// a task once it waits.
pub(crate) struct Refunding {
    refund: Pin<Box<dyn Future<Output = ()> + Send>>,
    detached: bool,
}

impl Refunding {
    pub(crate) fn new(policy: Arc<Policy>, of: Refund) -> Self {
        Self {
            refund: Box::pin(refund(policy, of)),
            detached: false,
        }
    }

    /// Moves the refund to a task; false outside a runtime.
    fn detach(&mut self) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let rest = std::mem::replace(&mut self.refund, Box::pin(std::future::ready(())));
        let task = runtime.spawn(rest);
        self.refund = Box::pin(async move {
            // A refund that panicked only leaves the cost charged.
            let _ = task.await;
        });
        true
    }
}

impl Future for Refunding {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.refund.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if self.detached || !self.detach() {
            return Poll::Pending;
        }
        self.detached = true;
        self.refund.as_mut().poll(cx)
    }
}
