//! The state of one resource (its buckets and leases) and the transitions
//! over all its limits at once: all pass or nothing is consumed. Pure
//! functions; the memory store calls them, the Lua mirrors them.

mod answers;
mod counters;
mod penalty;
mod slots;
mod take;

use super::bucket::{self, BucketParams, BucketState};
use super::limits::{Cost, Limits, Unit};
use super::observed::ObservedLimit;
use super::time::{micros, Micros};
pub use answers::{Booking, Decision, DenyReason, LeaseId, Marks, MARKED};
pub use counters::{observed_for, reconcile};
pub use penalty::{adopt, latest_not_before, penalize, penalize_until, penalty_left};
pub use slots::{release, renew, take_slot};
pub use take::{book, settle, try_acquire, wait_all};

/// Limits compiled for the state machine.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSpec {
    /// One entry per rate limit, in the order of [`Limits::rates`].
    pub buckets: Vec<(Unit, BucketParams)>,
    /// At most this many leases at once.
    pub max_concurrent: Option<u32>,
    /// A lease not released within this time expires (its holder died).
    pub lease_ttl: Micros,
}

impl LimitSpec {
    /// Compiles validated limits.
    pub fn new(limits: &Limits, lease_ttl: std::time::Duration) -> Self {
        Self {
            buckets: limits.rates.iter().map(|r| (r.unit, r.params())).collect(),
            max_concurrent: limits.max_concurrent,
            lease_ttl: micros(lease_ttl),
        }
    }

    /// True if no observed counter is narrower than its bucket: [`reconcile`]
    /// would change nothing.
    pub fn reconcile_is_noop(&self, observed: &ObservedLimit) -> bool {
        self.buckets.iter().enumerate().all(|(i, (_, p))| {
            observed_for(self, observed, i)
                .and_then(|o| o.remaining)
                .is_none_or(|r| r as f64 >= p.capacity())
        })
    }
}

/// A held concurrency slot and when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The lease id.
    pub id: LeaseId,
    /// When it expires if not released.
    pub expires: Micros,
}

/// The state of one resource key.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceState {
    /// One bucket per rate limit, aligned with [`LimitSpec::buckets`].
    pub buckets: Vec<BucketState>,
    /// Held concurrency slots.
    pub leases: Vec<Lease>,
    /// The end of a penalty on a resource without rate limits (with them,
    /// each bucket's `nb` carries it and this stays 0). Redis keeps it in
    /// the hash field `hold`.
    pub penalty: Micros,
}

impl ResourceState {
    /// Full buckets and no leases, as of `now`.
    pub fn fresh(spec: &LimitSpec, now: Micros) -> Self {
        Self {
            buckets: spec
                .buckets
                .iter()
                .map(|(_, p)| BucketState::fresh(p, now))
                .collect(),
            leases: Vec::new(),
            penalty: 0,
        }
    }
}

/// Each bucket's parameters and its part of `cost`.
fn costs(spec: &LimitSpec, cost: Cost) -> impl Iterator<Item = (&BucketParams, f64)> {
    spec.buckets
        .iter()
        .map(move |(u, p)| (p, cost.of(*u) as f64))
}

/// True when the state equals a fresh one and may be dropped.
pub fn is_idle(state: &ResourceState, spec: &LimitSpec, now: Micros) -> bool {
    state.penalty <= now
        && state.leases.iter().all(|l| l.expires <= now)
        && spec
            .buckets
            .iter()
            .zip(&state.buckets)
            .all(|((_, p), s)| bucket::is_idle(s, p, now))
}

#[cfg(test)]
mod tests;
