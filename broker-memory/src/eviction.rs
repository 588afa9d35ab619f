//! Idle-state eviction. A state that, refilled to now, is full with no
//! penalty and no live lease equals a fresh one, so dropping it loses
//! nothing. Sweeps are amortized: one runs when the map has doubled since
//! the last sweep, or when it holds many states and a while has passed.
//!
//! A state used within the last [`RECENT`] is kept even if idle: a key in
//! use whose bucket refills between calls (a generous limit) would
//! otherwise be dropped by every sweep and made again by its next call,
//! and with many such keys the map would grow back to the sweep threshold
//! at once, a sweep every few thousand calls.
//!
//! A resource's own state pinned by a registration (see [`crate::pinned`])
//! is kept too: the registration decides on it without the table, and
//! there is one per registered resource.
//!
//! The decision costs two relaxed atomic loads per write: the number of
//! states is tracked by counting inserts (and re-read exactly after each
//! sweep), so no write has to lock every shard to learn the map's length.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::States;
use broker_core::Micros;

/// Below this many states no sweep runs.
const MIN_SWEEP_LEN: usize = 4096;
/// A map this large is swept at least this often (µs).
const SWEEP_INTERVAL: Micros = 10_000_000;
/// A state used this recently (µs) is not evicted.
pub(crate) const RECENT: Micros = 50_000;

/// Drops every idle state not used within [`RECENT`] and not pinned by a
/// registration (see [`crate::pinned`]); returns how many.
pub(crate) fn evict_idle(states: &States, now: Micros) -> usize {
    let before = states.len();
    states.retain(|e| {
        let state = e.state.get();
        e.state.is_pinned_elsewhere()
            || now.saturating_sub(state.last_used()) < RECENT
            || !state.is_idle(&e.spec, now)
    });
    before.saturating_sub(states.len())
}

/// Decides when to sweep.
#[derive(Debug)]
pub(crate) struct Sweeper {
    /// States held: exact after a sweep, plus the inserts since.
    len: AtomicUsize,
    threshold: AtomicUsize,
    last: AtomicU64,
    running: AtomicBool,
}

impl Default for Sweeper {
    fn default() -> Self {
        Self {
            len: AtomicUsize::new(0),
            threshold: AtomicUsize::new(MIN_SWEEP_LEN),
            last: AtomicU64::new(0),
            running: AtomicBool::new(false),
        }
    }
}

impl Sweeper {
    /// Called after each write, with no shard lock held; `inserted` when the
    /// write created a state.
    #[inline]
    pub(crate) fn after_write(&self, states: &States, now: Micros, inserted: bool) {
        let len = if inserted {
            self.len.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.len.load(Ordering::Relaxed)
        };
        if len < MIN_SWEEP_LEN {
            return;
        }
        let grown = len > self.threshold.load(Ordering::Relaxed);
        let stale = now.saturating_sub(self.last.load(Ordering::Relaxed)) > SWEEP_INTERVAL;
        if !(grown || stale) || self.running.swap(true, Ordering::Acquire) {
            return;
        }
        evict_idle(states, now);
        self.after_sweep(states, now);
        self.running.store(false, Ordering::Release);
    }

    /// Re-reads the exact number of states after a sweep (also one run
    /// through [`crate::MemoryBackend::evict_idle`]).
    pub(crate) fn after_sweep(&self, states: &States, now: Micros) {
        let kept = states.len();
        self.len.store(kept, Ordering::Relaxed);
        self.threshold
            .store((kept * 2).max(MIN_SWEEP_LEN), Ordering::Relaxed);
        self.last.store(now, Ordering::Relaxed);
    }
}
