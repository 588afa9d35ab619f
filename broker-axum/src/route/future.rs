//! The route/service stage's response future: the one both stages share.

pub use crate::admission::future::ResponseFuture;
