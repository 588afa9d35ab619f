//! Integration tests of the facade live in `tests/`; this crate has no code of its own.
#![forbid(unsafe_code)]
