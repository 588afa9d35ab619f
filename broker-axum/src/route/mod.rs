//! The route/service stage, before authentication: the request's path
//! picks a per-route resource (longest prefix) or the per-service one.

mod layer;
mod service;

pub use layer::PressureLayer;
pub use service::PressureService;
