//! What an upstream said about its own limit, read from response headers.

use std::time::Duration;

use super::limits::Unit;

/// One upstream counter as reported in headers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    /// The upstream's limit (`X-Ratelimit-Limit`), if given.
    pub limit: Option<u64>,
    /// What remains in the upstream's window.
    pub remaining: Option<u64>,
    /// Time until the upstream's window resets.
    pub reset: Option<Duration>,
    /// The window the counter counts (IETF `RateLimit-Policy`'s `w`).
    pub window: Option<Duration>,
    /// The name of the upstream's policy the counter belongs to (IETF).
    pub policy: Option<std::sync::Arc<str>>,
}

/// Everything read from one upstream response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedLimit {
    /// The request counter (`X-Ratelimit-*`, `RateLimit`, `...-requests`).
    pub requests: Option<Observed>,
    /// The token counter (`x-ratelimit-remaining-tokens`, ...).
    pub tokens: Option<Observed>,
    /// `Retry-After` (or `X-Ratelimit-Retry`).
    pub retry_after: Option<Duration>,
}

impl ObservedLimit {
    /// The counter for `unit`.
    pub fn of(&self, unit: Unit) -> Option<&Observed> {
        match unit {
            Unit::Requests => self.requests.as_ref(),
            Unit::Tokens => self.tokens.as_ref(),
        }
    }
}
