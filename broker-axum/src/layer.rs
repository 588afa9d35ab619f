//! The two stages as tower layers: [`PressureLayer`] before authentication
//! (the request's path picks a route's resource, else the service's) and
//! [`TenantLayer`] after it (one state per tenant the extractor finds).

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use crate::admission::{Charge, ResponseFuture};
use crate::body::PermitBody;
use crate::extract::TenantExtractor;
use crate::policy::Policy;

/// The route/service stage as a tower [`Layer`]; place it before
/// authentication (outermost). Built by [`crate::Pressure::layer`].
#[derive(Debug, Clone)]
pub struct PressureLayer {
    pub(crate) policy: Arc<Policy>,
}

impl<S> Layer<S> for PressureLayer {
    type Service = PressureService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let policy = self.policy.clone();
        PressureService { inner, policy }
    }
}

/// The route/service stage: the longest matching route's resource, else the
/// service's. Built by [`crate::Pressure::layer`].
#[derive(Debug, Clone)]
pub struct PressureService<S> {
    inner: S,
    policy: Arc<Policy>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for PressureService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: PermitBody + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        match self.policy.stage_for(req.uri().path()) {
            Some(stage) => {
                ResponseFuture::admit(&self.policy, stage, None, None, &mut self.inner, req)
            }
            None => ResponseFuture::pass(&mut self.inner, req),
        }
    }
}

/// The tenant stage as a tower [`Layer`], placed inside authentication.
/// Built by [`crate::Pressure::tenant_layer`].
#[derive(Debug, Clone)]
pub struct TenantLayer<E> {
    pub(crate) policy: Arc<Policy>,
    pub(crate) extractor: E,
}

impl<S, E: TenantExtractor> Layer<S> for TenantLayer<E> {
    type Service = TenantService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        TenantService {
            inner,
            policy: self.policy.clone(),
            extractor: self.extractor.clone(),
        }
    }
}

/// The tenant stage: one state per tenant the [`TenantExtractor`] finds;
/// requests without a tenant pass. Built by [`crate::Pressure::tenant_layer`].
#[derive(Debug, Clone)]
pub struct TenantService<S, E> {
    inner: S,
    policy: Arc<Policy>,
    extractor: E,
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
        let policy = &self.policy;
        let Some(stage) = policy.tenant_stage() else {
            return ResponseFuture::pass(&mut self.inner, req);
        };
        // Taken out whatever comes next: only this stage answers for it.
        let charge = Charge::take(&mut req, policy.id);
        let tenant = self.extractor.tenant(req.headers(), req.extensions());
        match tenant.map(|t| policy.tenant_keys.key(&t)) {
            Some(key) => {
                ResponseFuture::admit(policy, stage, Some(key), charge, &mut self.inner, req)
            }
            None => ResponseFuture::pass(&mut self.inner, req),
        }
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
