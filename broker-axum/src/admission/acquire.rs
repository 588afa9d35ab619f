//! The broker's answer for a stage when the store needs I/O: one
//! `try_acquire`, or, for a path read two ways ([`Stage::Both`]), one per
//! reading, the first given back if the second refuses.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Acquisition, BrokerError, Cost, Permit};

use super::refund::{answered_here, spawn_refund, Refund, Refunding};
use crate::policy::{Policy, Stage};

/// The broker's answer on one stage.
pub(crate) struct Answer {
    pub(crate) result: Result<Acquisition, BrokerError>,
    /// The stage answered: the one asked for, or the part of
    /// [`Stage::Both`] that refused.
    pub(crate) stage: Stage,
    /// Its parts the store's failure policy answered (see [`Refund`]).
    pub(crate) answered_here: u8,
}

/// The broker's answer on `stage`. [`Stage::Both`] is asked part by part;
/// if the second refuses, the first part's cost is given back.
pub(crate) async fn acquire(policy: &Arc<Policy>, stage: Stage, tenant: Option<&str>) -> Answer {
    let mut parts = stage.parts();
    let (Some(first), Some(second)) = (parts.next(), parts.next()) else {
        let result = acquire_on(policy, stage, tenant).await;
        let answered_here = answered_here(&result);
        return Answer {
            result,
            stage,
            answered_here,
        };
    };
    let admitted = match acquire_on(policy, first, tenant).await {
        Ok(a) if a.allowed => a,
        refused => {
            let answered_here = answered_here(&refused);
            return Answer {
                result: refused,
                stage: first,
                answered_here,
            };
        }
    };
    let first_here = u8::from(admitted.answered_here);
    // A client leaving before the second answer gets the first refunded.
    let mut unanswered = FirstPart(Some((
        policy.clone(),
        Refund {
            stage: first,
            answered_here: first_here,
        },
    )));
    let result = acquire_on(policy, second, tenant).await;
    let second_here = answered_here(&result);
    let first_part = unanswered.0.take();
    match result {
        Ok(mut both) if both.allowed => {
            both.permit = admitted.permit.join(both.permit);
            Answer {
                result: Ok(both),
                stage,
                answered_here: first_here | second_here << 1,
            }
        }
        refused => {
            drop(admitted);
            if let Some((policy, of)) = first_part {
                Refunding::new(policy, of).await;
            }
            Answer {
                result: refused,
                stage: second,
                answered_here: second_here,
            }
        }
    }
}

/// The first part of a [`Stage::Both`] admission: dropped before the second
/// answers, it refunds the first from a task.
struct FirstPart(Option<(Arc<Policy>, Refund)>);

impl Drop for FirstPart {
    fn drop(&mut self) {
        if let Some((policy, of)) = self.0.take() {
            spawn_refund(policy, of);
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
