//! The tenant stage, after authentication: a [`TenantExtractor`] finds
//! who the request is for, and each tenant has its own state under one
//! per-tenant resource, keyed by a fingerprint of its id.

mod extract;
mod future;
pub(crate) mod keys;
mod layer;
mod service;

pub use extract::{FromExtension, FromHeader, Tenant, TenantExtractor};
pub use future::TenantFuture;
pub(crate) use keys::TenantKeys;
pub use keys::MAX_TENANT_LEN;
pub use layer::TenantLayer;
pub use service::TenantService;
