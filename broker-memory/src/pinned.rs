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
//! A pinned state stays in the table while a registration holds it: one
//! state per registered resource, so memory stays bounded. A
//! re-configuration that replaces the state (other buckets) marks the pin
//! dead, and its holder goes through the table from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use broker_core::state::ResourceState;

use crate::Stored;

/// A state shared by the table and a registration.
#[derive(Debug)]
pub(crate) struct Pinned {
    /// Cleared once the table no longer holds this state.
    live: AtomicBool,
    state: Stored,
}

impl Pinned {
    /// Whether the table still holds this state.
    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// The state.
    #[inline]
    pub(crate) fn state(&self) -> &Stored {
        &self.state
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

    /// Replaces the state; a pinned one is marked dead.
    pub(crate) fn replace(&mut self, state: Stored) {
        if let Self::Pinned(p) = std::mem::replace(self, Self::Table(state)) {
            p.live.store(false, Ordering::Release);
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

    /// Whether a registration holds the state: the sweeper keeps it.
    pub(crate) fn is_pinned_elsewhere(&self) -> bool {
        matches!(self, Self::Pinned(p) if Arc::strong_count(p) > 1)
    }
}
