//! The admission of one request: `try_acquire` on the stage's resource,
//! then either the denial (429, logged once) or the inner call, whose
//! response body takes the concurrency permit along.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use broker_core::{Cost, Permit, Target};
use http::{header, Method, Request, Response, StatusCode};
use tower::Service;

use crate::body::PressureBody;
use crate::policy::{Policy, Stage};
use crate::response;

/// The response future of [`crate::PressureService`] and
/// [`crate::TenantService`]. Its error is the inner service's error.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<PressureBody<B>>, E>> + Send + 'static>>;

/// Put in the request's extensions by the route/service stage when the
/// same [`crate::Pressure`] has a tenant stage: a request the tenant stage
/// denies gets its route/service cost back, so one tenant's rejected flood
/// does not use up the limit every tenant shares.
#[derive(Clone)]
pub(crate) struct Admitted {
    policy: Arc<Policy>,
    stage: Stage,
}

/// A request that would hold a slot for its whole lifetime: a WebSocket
/// (or other) upgrade, or an HTTP/2 extended CONNECT.
fn is_long_lived_request<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(header::UPGRADE) || req.method() == Method::CONNECT
}

/// A response that streams for as long as the client stays: switching
/// protocols, or server-sent events.
fn is_long_lived_response<B>(res: &Response<B>) -> bool {
    res.status() == StatusCode::SWITCHING_PROTOCOLS
        || res
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct.len() >= 17 && ct.as_bytes()[..17].eq_ignore_ascii_case(b"text/event-stream")
            })
}

/// Passes a request through untouched (no limit applies to it).
pub(crate) fn pass<S, ReqB, ResB>(
    mut inner: S,
    req: Request<ReqB>,
) -> ResponseFuture<ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
{
    let call = inner.call(req);
    Box::pin(async move { Ok(call.await?.map(|b| PressureBody::new(b, None))) })
}

/// Admits `req` on `stage` (for `tenant`, if given) and calls `inner`.
pub(crate) fn admit<S, ReqB, ResB>(
    policy: Arc<Policy>,
    stage: Stage,
    tenant: Option<String>,
    mut inner: S,
    mut req: Request<ReqB>,
) -> ResponseFuture<ResB, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
{
    Box::pin(async move {
        let Some(limited) = policy.limited(stage) else {
            return Ok(inner.call(req).await?.map(|b| PressureBody::new(b, None)));
        };
        let target: Target<'_> = match &tenant {
            Some(key) => (&*limited.id, key.as_str()).into(),
            None => (&*limited.id).into(),
        };
        let acquisition = match policy.broker.try_acquire(target, Cost::default()).await {
            Ok(a) => a,
            Err(error) => {
                tracing::warn!(
                    resource = %limited.id,
                    layer = stage.name(),
                    tenant = tenant.as_deref(),
                    %error,
                    "pressure check failed; answering the backend-error status"
                );
                return Ok(response::backend_failed(&policy.responses));
            }
        };
        if !acquisition.allowed {
            tracing::info!(
                resource = %limited.id,
                layer = stage.name(),
                wait_ms = u64::try_from(acquisition.wait_time.as_millis()).unwrap_or(u64::MAX),
                tenant = tenant.as_deref(),
                denied_by = ?acquisition.denied_by,
                "request denied"
            );
            if let Some(admitted) = req.extensions_mut().remove::<Admitted>() {
                admitted.refund().await;
            }
            return Ok(response::denied(
                &policy.responses,
                &limited.headers,
                acquisition.wait_time,
            ));
        }
        if !matches!(stage, Stage::Tenant) && policy.has_tenant_stage() {
            req.extensions_mut().insert(Admitted {
                policy: policy.clone(),
                stage,
            });
        }
        let long_lived = is_long_lived_request(&req);
        let permit: Option<Permit> = acquisition.permit.is_held().then_some(acquisition.permit);
        let res = inner.call(req).await?;
        let permit = permit.filter(|_| !long_lived && !is_long_lived_response(&res));
        Ok(res.map(|b| PressureBody::new(b, permit)))
    })
}

impl Admitted {
    /// Gives the route/service stage its cost back.
    async fn refund(self) {
        if let Some(limited) = self.policy.limited(self.stage) {
            // Errors are counted and logged by the broker; a failed refund
            // only leaves the cost charged, as without a refund.
            let _ = self
                .policy
                .broker
                .settle(&*limited.id, Cost::default(), Cost::requests(0))
                .await;
        }
    }
}
