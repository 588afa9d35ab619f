//! Integrations at the edge of the crate, built on the broker: the
//! supplier classes (auth and data buckets of one upstream supplier).

pub mod supplier;
