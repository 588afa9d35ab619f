//! [`PressureLayer`] and [`TenantLayer`]: cheap clones holding the shared
//! policy; all state lives in the broker.

use std::sync::Arc;

use tower::Layer;

use crate::policy::Policy;
use crate::service::{PressureService, TenantService};
use crate::tenant::TenantExtractor;

/// The route/service stage as a tower [`Layer`]; place it before
/// authentication (outermost). Built by [`crate::Pressure::layer`].
#[derive(Debug, Clone)]
pub struct PressureLayer {
    policy: Arc<Policy>,
}

impl PressureLayer {
    pub(crate) fn new(policy: Arc<Policy>) -> Self {
        Self { policy }
    }
}

impl<S> Layer<S> for PressureLayer {
    type Service = PressureService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PressureService::new(inner, self.policy.clone())
    }
}

/// The tenant stage as a tower [`Layer`]; place it after authentication
/// (inside it), so the extractor sees what auth put in the request. Built
/// by [`crate::Pressure::tenant_layer`].
#[derive(Debug, Clone)]
pub struct TenantLayer<E> {
    policy: Arc<Policy>,
    extractor: E,
}

impl<E> TenantLayer<E> {
    pub(crate) fn new(policy: Arc<Policy>, extractor: E) -> Self {
        Self { policy, extractor }
    }
}

impl<S, E: TenantExtractor> Layer<S> for TenantLayer<E> {
    type Service = TenantService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        TenantService::new(inner, self.policy.clone(), self.extractor.clone())
    }
}
