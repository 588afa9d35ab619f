//! [`Slot`]: how the table holds a state: in the table's slot itself, or
//! [`Pinned`]: shared with the [`crate::local::ResourceStates`] of a
//! registration, which decides on the resource's own state (a route's or a
//! service's limit, no sub-key) without hashing its key, locking its shard
//! or looking it up.
//!
//! The table keeps a pinned state where keyed calls, the sweeper and
//! re-registrations find it. They run under the shard's write lock, as for
//! any state, but the decisions through the pin do not take that lock, so
//! every transition on a pinned state goes through the state's own guard:
//! a one-bucket state's [`crate::cell::BucketCell::update`] (which claims
//! the cell as a taking decision does), any other state's mutex.
//!
//! A pinned state stays in the table while anything besides the table
//! holds it (a registration, or a retired one still kept alive by a
//! thread's cached registry or a handle): one state per registered
//! resource, so memory stays bounded. A re-configuration that replaces the
//! state (another number of buckets, or a concurrency limit that comes or
//! goes) retires the pinned one under its guard, as it reads it: a
//! decision through the pin that comes later, or was in flight, finds it
//! retired and goes to the table, so none is lost. The registration then
//! pins the state again on its next decision (a few times at most, see
//! [`crate::local::ResourceStates`]): when the retiring decision came
//! through an older registration still in flight, the current one keeps
//! its pin.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use broker_core::state::ResourceState;
use broker_core::LeaseId;

use crate::{one_state, Stored};

/// A state shared by the table and a registration. It starts a pair of
/// cache lines of its own, the state first, so that a one-bucket state's
/// cell (32 bytes, after the state's tag) lies within one line, apart from
/// the `Arc`'s counts and from whatever is allocated next to it. Two
/// threads deciding on one resource's own state took 650–670 ns per pair
/// of decisions when the cell followed the counts, 150–210 ns so
/// (`threads2/one_key/broker_try_acquire` in `benches/memory_try_acquire.rs`).
#[derive(Debug)]
#[repr(C, align(128))]
pub(crate) struct Pinned {
    state: Stored,
    /// Cleared once the table no longer holds this state.
    live: AtomicBool,
}

impl Pinned {
    /// Whether the table still holds this state.
    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// The state. A decision through the pin asks [`Pinned::is_live`]
    /// under the state's lock ([`Stored::decide`]'s `held`); a retired
    /// one-bucket cell refuses decisions by itself.
    #[inline]
    pub(crate) fn state(&self) -> &Stored {
        &self.state
    }

    /// Frees the slot held under `lease`; `None` once the state is
    /// retired (the lease, if held, went to the table's state with it).
    pub(crate) fn release(&self, lease: LeaseId) -> Option<bool> {
        self.state.release(lease, || self.is_live())
    }

    /// Retires the state, under its guard, and returns it as the last
    /// decision left it.
    fn retire(&self) -> ResourceState {
        let retired = match &self.state {
            Stored::One(b) => one_state(b.retire()),
            Stored::Full(s) => {
                let s = s.lock();
                self.live.store(false, Ordering::Relaxed);
                s.clone()
            }
        };
        self.live.store(false, Ordering::Release);
        retired
    }
}

/// A state as an entry of the table holds it.
#[derive(Debug)]
pub(crate) enum Slot {
    /// In the table's slot: transitions other than `try` and release run
    /// under the shard's write lock, through `&mut`.
    Table(Stored),
    /// Shared with a registration (see the module's documentation).
    Pinned(Arc<Pinned>),
}

impl Slot {
    /// The state, wherever it is held.
    #[inline]
    pub(crate) fn get(&self) -> &Stored {
        match self {
            Self::Table(s) => s,
            Self::Pinned(p) => &p.state,
        }
    }

    /// Runs a reference transition on the state (under the shard's write
    /// lock).
    pub(crate) fn with_full<R>(&mut self, f: impl FnOnce(&mut ResourceState) -> R) -> R {
        match self {
            Self::Table(s) => s.with_full(f),
            Self::Pinned(p) => p.state.with_shared(f),
        }
    }

    /// The state as the reference transitions take it, for a state about
    /// to be replaced (the caller puts the new one in this slot): a pinned
    /// one is retired as it is read.
    pub(crate) fn take(&mut self) -> ResourceState {
        match self {
            Self::Table(s) => s.to_state(),
            Self::Pinned(p) => p.retire(),
        }
    }

    /// The state, pinned (under the shard's write lock).
    pub(crate) fn pin(&mut self) -> Arc<Pinned> {
        let pinned = match std::mem::replace(self, Self::Table(Stored::placeholder())) {
            Self::Pinned(p) => p,
            Self::Table(state) => Arc::new(Pinned {
                live: AtomicBool::new(true),
                state,
            }),
        };
        *self = Self::Pinned(pinned.clone());
        pinned
    }

    /// Whether anything besides the table holds the state (a registration,
    /// live or retired): the sweeper keeps it.
    pub(crate) fn is_pinned_elsewhere(&self) -> bool {
        matches!(self, Self::Pinned(p) if Arc::strong_count(p) > 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::{Cost, LimitSpec, Limits, RateLimit};
    use std::time::Duration;

    fn spec(limits: Limits) -> LimitSpec {
        LimitSpec::new(&limits, Duration::from_secs(60))
    }

    /// Once the table replaces a pinned state, decisions and releases
    /// through the pin are refused (they go to the table), for a
    /// one-bucket state and for one with a concurrency limit; what the pin
    /// took before is in the state the replacement read.
    #[test]
    fn a_replaced_pin_refuses_decisions_and_releases() {
        let one = spec(Limits::new().rate(RateLimit::per_second(5)));
        let held = spec(
            Limits::new()
                .rate(RateLimit::per_second(5))
                .max_concurrent(2),
        );
        for spec in [one, held] {
            let mut slot = Slot::Table(Stored::fresh(&spec, 0));
            let pin = slot.pin();
            let lease = u64::from(spec.max_concurrent.is_some());
            let decide = |lease| {
                pin.state()
                    .decide(&spec, 0, Cost::default(), lease, || pin.is_live())
            };
            let first = decide(lease);
            assert!(matches!(first, Some(Ok(_))));
            let read = slot.take();
            assert_eq!(read.buckets[0].tokens, 4.0, "the pin's decision is in it");
            assert!(!pin.is_live());
            assert!(decide(7).is_none());
            // A one-bucket state holds no lease to give the table.
            let released = pin.release(lease);
            let expected = if spec.max_concurrent.is_some() {
                None
            } else {
                Some(false)
            };
            assert_eq!(released, expected);
        }
    }
}
