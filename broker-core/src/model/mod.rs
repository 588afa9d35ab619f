//! The model: limits and costs, the token bucket, the state over several
//! limits, the answers of a decision, header parsing, retry arithmetic,
//! pacing and key building. Pure functions over plain data: no tokio, no
//! I/O, no metrics or tracing, and no module imports another in a loop
//! (`tests/model_is_pure.rs` checks it).

pub mod bucket;
pub mod error;
pub mod headers;
pub mod keys;
pub mod limits;
pub mod observed;
pub mod pacing;
pub mod resource_config;
pub mod retry;
pub mod state;
pub mod time;
pub mod verdict;
