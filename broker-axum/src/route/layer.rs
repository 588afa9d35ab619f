//! [`PressureLayer`]: the route/service stage as a tower layer.

use std::sync::Arc;

use tower::Layer;

use super::PressureService;
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
