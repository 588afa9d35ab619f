//! The tenant stage, after authentication: each tenant the [`TenantExtractor`]
//! finds has its own state under the per-tenant resource.

mod extract;
pub(crate) mod keys;
mod layer;
mod service;

pub use crate::admission::TenantFuture;
pub use extract::{FromExtension, FromHeader, Tenant, TenantExtractor};
pub(crate) use keys::TenantKeys;
pub use keys::MAX_TENANT_LEN;
pub use layer::TenantLayer;
pub use service::TenantService;
