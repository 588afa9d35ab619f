//! The tenant stage, after authentication: each tenant the [`TenantExtractor`]
//! finds has its own state under the per-tenant resource.

mod extract;
pub(crate) mod keys;
mod layer;
mod service;

pub use extract::{FromExtension, FromHeader, Tenant, TenantExtractor};
pub use layer::TenantLayer;
pub use service::TenantService;
