//! Behaviour shared by the test binaries: scenarios written once against
//! `&dyn Store` and a [`ManualClock`], run on every backend.
#![allow(dead_code)]

pub mod cases;
pub mod seed;
