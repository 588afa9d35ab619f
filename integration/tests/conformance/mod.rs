//! The conformance suite: one set of behaviour cases, written once against
//! `&dyn Store` and a [`broker_core::ManualClock`], run on every backend
//! (`conformance_memory.rs`, `conformance_redis.rs`,
//! `conformance_cluster.rs`). The seed scenario comes from `tests/common`.
#![allow(dead_code)]

pub mod cases;
pub mod env;
