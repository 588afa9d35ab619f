//! Giving a route/service stage its cost back (`settle` to zero) when the
//! request never reaches its handler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use broker_core::{Cost, Marks};

use crate::policy::{Policy, Stage};

/// Where one route/service admission was charged; bit `i` of
/// `answered_here` is set when the failure policy answered part `i`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refund {
    pub(crate) stage: Stage,
    pub(crate) answered_here: u8,
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
    drop(refunding(policy, of));
}

/// A refund that runs to its end even if dropped: on a task of its own, or
/// in place outside a runtime.
pub(crate) type Refunding = Pin<Box<dyn Future<Output = ()> + Send>>;

pub(crate) fn refunding(policy: Arc<Policy>, of: Refund) -> Refunding {
    let refund = refund(policy, of);
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let task = runtime.spawn(refund);
            // A refund that panicked only leaves the cost charged.
            Box::pin(async move {
                let _ = task.await;
            })
        }
        Err(_) => Box::pin(refund),
    }
}
