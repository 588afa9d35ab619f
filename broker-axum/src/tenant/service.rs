//! [`TenantService`]: one state per tenant the extractor finds.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::TenantExtractor;
use crate::admission::{Charge, ResponseFuture};
use crate::body::PermitBody;
use crate::policy::Policy;

/// The tenant stage: one state per tenant the [`TenantExtractor`] finds;
/// requests without a tenant pass. Built by [`crate::Pressure::tenant_layer`].
#[derive(Debug, Clone)]
pub struct TenantService<S, E> {
    pub(crate) inner: S,
    pub(crate) policy: Arc<Policy>,
    pub(crate) extractor: E,
}

impl<S, E, ReqB, ResB> Service<Request<ReqB>> for TenantService<S, E>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: PermitBody + Send + 'static,
    E: TenantExtractor,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let (policy, stage) = (&self.policy, self.policy.tenant);
        // Taken out whatever comes next: only this stage answers for it.
        let charge = stage.and_then(|_| Charge::take(&mut req, policy.id));
        let tenant = stage.and_then(|_| self.extractor.tenant(req.headers(), req.extensions()));
        let tenant = tenant.map(|t| policy.tenant_keys.key(&t));
        let stage = stage.filter(|_| tenant.is_some());
        ResponseFuture::admit(policy, stage, tenant, charge, &mut self.inner, req)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tenant_stage_debug_output_names_its_parts() {
        use tower::Layer;
        #[derive(Debug)]
        struct Inner;
        let config = crate::PressureConfig::from_json(
            "test",
            r#"{ "enabled": true,
                 "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 5 } } }"#,
        )
        .unwrap();
        let broker = broker_core::ResourceBroker::new(broker_memory::MemoryBackend::new());
        let pressure = crate::Pressure::new(broker, &config).unwrap();
        let header = http::HeaderName::from_static("x-tenant");
        let svc = pressure
            .tenant_layer(crate::FromHeader::new(header))
            .layer(Inner);
        let shown = format!("{svc:?}");
        assert!(shown.starts_with("TenantService { inner: Inner"), "{shown}");
        assert!(shown.contains("x-tenant"), "{shown}");
    }
}
