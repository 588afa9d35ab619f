//! The model: limits, the token bucket, the state over several limits,
//! header parsing, retries, pacing and keys. Pure functions over plain data:
//! no I/O, tokio, metrics or tracing (`tests/model_is_pure.rs` checks it).

pub mod bucket;
pub mod error;
pub mod headers;
pub mod keys;
pub mod limits;
pub mod observed;
pub mod resource_config;
pub mod retry;
pub mod state;
pub mod time;
