//! A denied or failed admission: logged once, answered `429` with its headers
//! or the backend-error status.

use broker_core::{Acquisition, BrokerError, DenyReason, Permit};
use http::Response;

use crate::body::PermitBody;
use crate::policy::{Policy, Stage};
use crate::response;

/// The permit an admitted request carries, or the response refusing it
/// (logged; a backend failure at debug level, as the broker warns).
pub(crate) fn judge<B: PermitBody>(
    policy: &Policy,
    stage: Stage,
    result: Result<Acquisition, BrokerError>,
    tenant: Option<&str>,
) -> Result<Permit, Response<B>> {
    let limited = policy.limited(stage);
    let resource = limited.map_or("", |l| &*l.id);
    let a = match result {
        Ok(a) if a.allowed => return Ok(a.permit),
        Ok(a) => a,
        Err(error) => {
            tracing::debug!(
                resource = %resource,
                layer = stage.name(),
                tenant,
                %error,
                "pressure check failed; answering the backend-error status"
            );
            return Err(response::backend_failed(&policy.responses));
        }
    };
    tracing::info!(
        resource = %resource,
        layer = stage.name(),
        wait_ms = u64::try_from(a.wait_time.as_millis()).unwrap_or(u64::MAX),
        tenant,
        denied_by = ?a.denied_by,
        "request denied"
    );
    Err(match limited {
        Some(limited) => response::denied(
            &policy.responses,
            &limited.headers(&policy.broker),
            a.wait_time,
            a.denied_by == Some(DenyReason::Concurrency),
        ),
        None => response::backend_failed(&policy.responses),
    })
}
