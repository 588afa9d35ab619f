//! The broker's answer for a stage when the store needs I/O: one
//! `try_acquire`, or one per reading of a [`Stage::Both`], the first given
//! back if the second refuses.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Acquisition, BrokerError, Cost, Permit};

use super::refund::{refunding, spawn_refund, Refund};
use crate::policy::{Policy, Stage};

/// The broker's answer on one stage.
pub(crate) struct Answer {
    pub(crate) result: Result<Acquisition, BrokerError>,
    /// The stage asked for, or the part of [`Stage::Both`] that refused.
    pub(crate) stage: Stage,
    /// The parts the store's failure policy answered (see [`Refund`]).
    pub(crate) answered_here: u8,
}

impl Answer {
    pub(crate) fn new(result: Result<Acquisition, BrokerError>, stage: Stage) -> Self {
        let answered_here = result.as_ref().map_or(0, |a| u8::from(a.answered_here));
        Self {
            result,
            stage,
            answered_here,
        }
    }
}

/// The broker's answer on `stage`, part by part.
pub(crate) async fn acquire(policy: &Arc<Policy>, stage: Stage, tenant: Option<&str>) -> Answer {
    let mut parts = stage.parts();
    let (Some(first), Some(second)) = (parts.next(), parts.next()) else {
        return Answer::new(acquire_on(policy, stage, tenant).await, stage);
    };
    let admitted = match acquire_on(policy, first, tenant).await {
        Ok(a) if a.allowed => a,
        refused => return Answer::new(refused, first),
    };
    let first_here = u8::from(admitted.answered_here);
    let of = Refund {
        stage: first,
        answered_here: first_here,
    };
    // A client leaving before the second answer gets the first refunded.
    let mut unanswered = FirstPart(Some(policy.clone()), of);
    let result = acquire_on(policy, second, tenant).await;
    unanswered.0 = None;
    match result {
        Ok(mut both) if both.allowed => {
            let second_here = u8::from(both.answered_here);
            both.permit = admitted.permit.join(both.permit);
            Answer {
                result: Ok(both),
                stage,
                answered_here: first_here | second_here << 1,
            }
        }
        refused => {
            drop(admitted);
            refunding(policy.clone(), of).await;
            Answer::new(refused, second)
        }
    }
}

/// The first part of a [`Stage::Both`] admission: dropped before the second
/// answers, it refunds the first from a task.
struct FirstPart(Option<Arc<Policy>>, Refund);

impl Drop for FirstPart {
    fn drop(&mut self) {
        if let Some(policy) = self.0.take() {
            spawn_refund(policy, self.1);
        }
    }
}

/// The broker's answer on the one resource of `stage`.
async fn acquire_on(
    policy: &Policy,
    stage: Stage,
    tenant: Option<&str>,
) -> Result<Acquisition, BrokerError> {
    match policy.limited(stage) {
        Some(limited) => limited.handle.try_acquire(tenant, Cost::default()).await,
        None => Ok(Acquisition {
            allowed: true,
            wait_time: Duration::ZERO,
            denied_by: None,
            permit: Permit::empty(),
            answered_here: false,
        }),
    }
}
