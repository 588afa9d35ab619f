//! [`TenantLayer`]: a cheap clone of the shared policy and the extractor.

use std::sync::Arc;

use tower::Layer;

use super::extract::TenantExtractor;
use super::service::TenantService;
use crate::policy::Policy;

/// The tenant stage as a tower [`Layer`], placed inside authentication.
/// Built by [`crate::Pressure::tenant_layer`].
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
