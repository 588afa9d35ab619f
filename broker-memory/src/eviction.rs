//! Idle-state eviction. A state that, refilled to now, is full with no
//! penalty and no live lease equals a fresh one, so dropping it loses
//! nothing. Sweeps are amortized: one runs when the map has doubled since
//! the last sweep, or when it holds many states and a while has passed.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use broker_core::state;
use broker_core::Micros;
use dashmap::DashMap;

use crate::Entry;

/// Below this many states no sweep runs.
const MIN_SWEEP_LEN: usize = 4096;
/// A map this large is swept at least this often (µs).
const SWEEP_INTERVAL: Micros = 10_000_000;

/// Drops every idle state; returns how many.
pub(crate) fn evict_idle(states: &DashMap<Box<str>, Entry>, now: Micros) -> usize {
    let before = states.len();
    states.retain(|_, e| !state::is_idle(&e.state, &e.spec, now));
    before.saturating_sub(states.len())
}

/// Decides when to sweep.
#[derive(Debug)]
pub(crate) struct Sweeper {
    threshold: AtomicUsize,
    last: AtomicU64,
    running: AtomicBool,
}

impl Default for Sweeper {
    fn default() -> Self {
        Self {
            threshold: AtomicUsize::new(MIN_SWEEP_LEN),
            last: AtomicU64::new(0),
            running: AtomicBool::new(false),
        }
    }
}

impl Sweeper {
    /// Called after each write, with no shard lock held.
    pub(crate) fn after_write(&self, states: &DashMap<Box<str>, Entry>, now: Micros) {
        let len = states.len();
        if len < MIN_SWEEP_LEN {
            return;
        }
        let grown = len > self.threshold.load(Ordering::Relaxed);
        let stale = now.saturating_sub(self.last.load(Ordering::Relaxed)) > SWEEP_INTERVAL;
        if !(grown || stale) || self.running.swap(true, Ordering::Acquire) {
            return;
        }
        evict_idle(states, now);
        let kept = states.len();
        self.threshold
            .store((kept * 2).max(MIN_SWEEP_LEN), Ordering::Relaxed);
        self.last.store(now, Ordering::Relaxed);
        self.running.store(false, Ordering::Release);
    }
}
