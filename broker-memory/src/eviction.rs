//! Idle-state eviction and the bound on the number of states. A state
//! that, refilled to now, is full with no penalty and no live lease equals
//! a fresh one, so dropping it loses nothing. Sweeps are amortized: one
//! runs when the map has doubled since the last sweep, or when it holds
//! many states and a while has passed, or when it reaches the store's
//! bound.
//!
//! A state used within the last [`RECENT`] is kept even if idle: a key in
//! use whose bucket refills between calls (a generous limit) would
//! otherwise be dropped by every sweep and made again by its next call,
//! and with many such keys the map would grow back to the sweep threshold
//! at once, a sweep every few thousand calls.
//!
//! A resource's own state that a registration decides on is kept too
//! (see [`crate::local`]): there is one per registered resource.
//!
//! At the bound, a sweep drops idle states first; if that leaves more than
//! seven eighths of the bound, it drops the states least recently taken
//! from (a denial takes nothing) that still count, down to seven eighths,
//! folding each into a place (see [`crate::spill`]), so the next sweep is
//! an eighth of the bound of new states away. A state holding a slot is
//! never dropped (a release must find it): those are as many as the
//! requests in flight, so the bound can be passed by that many. Nor is a
//! state under a penalty of a resource without rate limits
//! ([`broker_core::state::ResourceState::penalty`]), which no place keeps,
//! until the penalty ends: those are as many as the keys an upstream
//! answered 429 for within one penalty. A sweep does not see the states
//! made after it counted them: an insert that finds the store an eighth
//! past the bound while another thread sweeps waits for that sweep and
//! then sweeps in turn, so threads flooding new keys cannot outgrow a
//! sweep.
//!
//! Whether a sweep is due is a few relaxed atomic loads per write: the
//! number of states is tracked by counting inserts (and re-read exactly
//! after each sweep), so no write locks every shard to learn it.
//! Each sweep also drops the place sets whose places have all refilled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use broker_core::Micros;
use parking_lot::Mutex;

use crate::key::StateKey;
use crate::spill::Spills;
use crate::states::Entry;
use crate::store::Store;

/// Below this many states no sweep runs but at the bound.
const MIN_SWEEP_LEN: usize = 4096;
/// A map this large is swept at least this often (µs).
const SWEEP_INTERVAL: Micros = 10_000_000;
/// A state used this recently (µs) is not evicted.
pub(crate) const RECENT: Micros = 50_000;
/// The bound a store starts with.
pub(crate) const DEFAULT_MAX_STATES: usize = 1 << 20;
/// The lowest bound a store takes.
pub(crate) const MIN_MAX_STATES: usize = 64;

/// Whether `key` is the own state of a resource a registration decides
/// on (see [`Store::register_own`]): never dropped.
fn registered(key: &StateKey, registered: &HashMap<Arc<str>, usize>) -> bool {
    key.is_own() && registered.contains_key(key.resource())
}

/// Drops every idle state not used within [`RECENT`] and not kept by a
/// registration; returns how many.
pub(crate) fn evict_idle(store: &Store, now: Micros) -> usize {
    let states = &store.states;
    let kept = store.registered.lock();
    let before = states.len();
    states.retain(|k, e| {
        registered(k, &kept) || now.saturating_sub(e.last_used()) < RECENT || !e.is_idle(now)
    });
    before.saturating_sub(states.len())
}

/// Whether a state may be folded away: not kept by a registration, holding
/// no live slot, and under no state-wide hold (a penalty on a resource
/// without rate limits, which no place keeps).
fn foldable(k: &StateKey, e: &Entry, now: Micros, kept: &HashMap<Arc<str>, usize>) -> bool {
    !registered(k, kept) && !e.holds_slot_or_hold(now)
}

/// Drops idle states, then folds the states least recently taken from that
/// still count (see [`crate::spill`]) until at most `keep` are left;
/// returns how many of the states it counted no fold may drop (kept by a
/// registration, holding a slot, or under a state-wide hold), 0 when none
/// had to be folded.
pub(crate) fn fold_to(store: &Store, now: Micros, keep: usize, budget: usize) -> usize {
    evict_idle(store, now);
    let (states, spills) = (&store.states, &store.spills);
    let len = states.len();
    if len <= keep {
        return 0;
    }
    let kept = store.registered.lock();
    let mut ages = Vec::with_capacity(len);
    let mut held = 0;
    states.for_each(|k, e| match foldable(k, e, now, &kept) {
        true => ages.push(e.last_used()),
        false => held += 1,
    });
    let excess = (len - keep).min(ages.len());
    if excess == 0 {
        return held;
    }
    let (_, &mut cutoff, _) = ages.select_nth_unstable(excess - 1);
    // Every state older than the cutoff goes; of those used at the cutoff,
    // only as many as make up the excess (in shard order).
    let older = ages.iter().filter(|&&a| a < cutoff).count();
    drop(ages);
    let mut ties = excess - older;
    let mut left = excess;
    states.retain(|k, e| {
        if left == 0 || !foldable(k, e, now, &kept) {
            return true;
        }
        let used = e.last_used();
        if used > cutoff || (used == cutoff && ties == 0) {
            return true;
        }
        let hash = states.hash(crate::key::Parts::parts(k));
        spills.fold(k.resource(), hash, &e.state, &e.spec, now, budget);
        if used == cutoff {
            ties -= 1;
        }
        left -= 1;
        false
    });
    held
}

/// Decides when to sweep.
#[derive(Debug)]
pub(crate) struct Sweeper {
    /// States held: exact after a sweep, plus the inserts since.
    len: AtomicUsize,
    /// No sweep runs below this many states: [`MIN_SWEEP_LEN`], or the
    /// bound if lower.
    floor: AtomicUsize,
    threshold: AtomicUsize,
    /// The bound.
    max: AtomicUsize,
    last: AtomicU64,
    /// Held by the thread that sweeps.
    sweeping: Mutex<()>,
    /// Inserts waiting for a sweep to end (see [`Sweeper::wait_for_sweep`]).
    #[cfg(test)]
    pub(crate) waiting: AtomicUsize,
}

impl Default for Sweeper {
    fn default() -> Self {
        // What `set_max(DEFAULT_MAX_STATES)` sets on an empty store (the
        // default bound is above `MIN_SWEEP_LEN`).
        Self {
            len: AtomicUsize::new(0),
            threshold: AtomicUsize::new(MIN_SWEEP_LEN),
            floor: AtomicUsize::new(MIN_SWEEP_LEN),
            max: AtomicUsize::new(DEFAULT_MAX_STATES),
            last: AtomicU64::new(0),
            sweeping: Mutex::new(()),
            #[cfg(test)]
            waiting: AtomicUsize::new(0),
        }
    }
}

impl Sweeper {
    /// Bounds the store at `max` states (at least [`MIN_MAX_STATES`]).
    pub(crate) fn set_max(&self, max: usize) {
        let max = max.max(MIN_MAX_STATES);
        self.max.store(max, Ordering::Relaxed);
        self.floor.store(MIN_SWEEP_LEN.min(max), Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed);
        self.threshold
            .store((len * 2).max(MIN_SWEEP_LEN).min(max), Ordering::Relaxed);
    }

    /// The bound.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Called after each write, with no lock of the store held; `inserted`
    /// when the write created a state.
    pub(crate) fn after_write(&self, store: &Store, now: Micros, inserted: bool) {
        let len = if inserted {
            self.len.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.len.load(Ordering::Relaxed)
        };
        if len < self.floor.load(Ordering::Relaxed) {
            return;
        }
        let grown = len > self.threshold.load(Ordering::Relaxed);
        let stale = now.saturating_sub(self.last.load(Ordering::Relaxed)) > SWEEP_INTERVAL;
        if !(grown || stale) {
            return;
        }
        match self.sweeping.try_lock() {
            Some(_sweeping) => self.sweep(store, now, len),
            None if inserted => self.wait_for_sweep(store, now, len),
            None => {}
        }
    }

    /// One sweep, by the thread that holds `sweeping`.
    fn sweep(&self, store: &Store, now: Micros, len: usize) {
        let max = self.max();
        let held = if len >= max {
            fold_to(store, now, max - max / 8, Spills::budget_for(max))
        } else {
            evict_idle(store, now);
            0
        };
        store.spills.drop_idle(now);
        self.after_sweep(store, now, held);
    }

    /// An insert that finds the store an eighth past its bound while
    /// another thread sweeps: waits for that sweep to end, then sweeps
    /// itself if one is still due. A sweep does not see the states made
    /// after it counted them, so without this wait threads inserting new
    /// keys while one thread folds could grow the store past its bound
    /// by as many as they insert meanwhile. Costs nothing below the bound.
    fn wait_for_sweep(&self, store: &Store, now: Micros, len: usize) {
        let max = self.max();
        if len < max + max / 8 {
            return;
        }
        #[cfg(test)]
        self.waiting.fetch_add(1, Ordering::Relaxed);
        drop(self.sweeping.lock());
        #[cfg(test)]
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        self.after_write(store, now, false);
    }

    /// Re-reads the exact number of states after a sweep (also one run
    /// through [`crate::MemoryBackend::evict_idle`]); `held`: how many
    /// states the sweep found that no fold may drop (see [`fold_to`]; 0
    /// for a sweep that folded none). The next sweep is due when the map
    /// has doubled, or has reached the bound, or (when the states no fold
    /// may drop leave less than an eighth of the bound: states holding
    /// slots) has grown by an eighth of the bound past them. Only those
    /// states move it past the bound: a sweep that drops idle states alone
    /// (one due on time) leaves many that count, and the next sweep, at
    /// the bound, folds them.
    pub(crate) fn after_sweep(&self, store: &Store, now: Micros, held: usize) {
        let kept = store.states.len();
        let max = self.max();
        let next = if held + max / 8 > max {
            held + held.max(max) / 8
        } else {
            (kept * 2).max(MIN_SWEEP_LEN).min(max)
        };
        self.len.store(kept, Ordering::Relaxed);
        self.threshold.store(next, Ordering::Relaxed);
        self.last.store(now, Ordering::Relaxed);
    }
}
