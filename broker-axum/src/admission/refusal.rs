//! A denied or failed admission: logged once when decided, answered
//! (`429` with its headers, or the backend-error status) when polled.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Acquisition, BrokerError, DenyReason, Permit};
use http::Response;

use super::charge::Charge;
use crate::body::PermitBody;
use crate::policy::{Policy, Stage};
use crate::response;

/// A denied or failed admission, to be answered.
pub(crate) struct Refusal {
    policy: Arc<Policy>,
    stage: Stage,
    /// The wait of a denial; none for a backend failure.
    wait: Option<Duration>,
    by_concurrency: bool,
    /// The route/service charge a tenant-stage refusal gives back.
    charge: Option<Arc<Charge>>,
}

/// The permit an admitted request carries, or the refusal to answer.
pub(crate) fn judge(
    policy: &Arc<Policy>,
    stage: Stage,
    result: Result<Acquisition, BrokerError>,
    tenant: Option<&str>,
) -> Result<Permit, Refusal> {
    match result {
        Ok(acquisition) if acquisition.allowed => Ok(acquisition.permit),
        refused => Err(Refusal::logged(policy, stage, refused, tenant)),
    }
}

impl Refusal {
    /// The refusal of `result`, logged (a backend failure at debug level:
    /// the broker warns).
    fn logged(
        policy: &Arc<Policy>,
        stage: Stage,
        result: Result<Acquisition, BrokerError>,
        tenant: Option<&str>,
    ) -> Self {
        let resource = policy.limited(stage).map_or("", |l| &*l.id);
        let (wait, by_concurrency) = match result {
            Ok(a) => {
                tracing::info!(
                    resource = %resource,
                    layer = stage.name(),
                    wait_ms = u64::try_from(a.wait_time.as_millis()).unwrap_or(u64::MAX),
                    tenant,
                    denied_by = ?a.denied_by,
                    "request denied"
                );
                let by_concurrency = a.denied_by == Some(DenyReason::Concurrency);
                (Some(a.wait_time), by_concurrency)
            }
            Err(error) => {
                tracing::debug!(
                    resource = %resource,
                    layer = stage.name(),
                    tenant,
                    %error,
                    "pressure check failed; answering the backend-error status"
                );
                (None, false)
            }
        };
        Self {
            policy: policy.clone(),
            stage,
            wait,
            by_concurrency,
            charge: None,
        }
    }

    /// This refusal, by the tenant stage, gives `charge` back (if any).
    pub(crate) fn giving_back(mut self, charge: Option<Arc<Charge>>) -> Self {
        self.charge = charge;
        self
    }

    /// The response, naming the charge it gives back.
    pub(crate) fn respond<B: PermitBody>(self) -> Response<B> {
        let policy = &self.policy;
        let mut res = match (self.wait, policy.limited(self.stage)) {
            (Some(wait), Some(limited)) => response::denied(
                &policy.responses,
                &limited.headers(&policy.broker),
                wait,
                self.by_concurrency,
            ),
            _ => response::backend_failed(&policy.responses),
        };
        if let Some(charge) = self.charge {
            charge.name_on(&mut res);
        }
        res
    }
}
