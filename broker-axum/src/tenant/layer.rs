//! [`TenantLayer`]: the tenant stage as a tower layer.

use std::sync::Arc;

use tower::Layer;

use super::{TenantExtractor, TenantService};
use crate::policy::Policy;

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
