//! Idle-state eviction (an idle state equals a fresh one) and the bound on the
//! number of states, past which the least recently used are folded
//! ([`crate::spill`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use broker_core::{state, Micros};
use parking_lot::Mutex;

use crate::key::{Parts, StateKey};
use crate::store::{Entry, Store};

/// Below this many states no sweep runs but at the bound.
const MIN_SWEEP_LEN: usize = 4096;
/// A map this large is swept at least this often (µs).
const SWEEP_INTERVAL: Micros = 10_000_000;
/// A state used this recently (µs) is not evicted.
pub(crate) const RECENT: Micros = 50_000;
/// The bound a store starts with.
const DEFAULT_MAX_STATES: usize = 1 << 20;
/// The lowest bound a store takes.
const MIN_MAX_STATES: usize = 64;

type Registered = HashMap<Arc<str>, usize>;

/// Whether `key` is the own state of a registered resource: never dropped.
fn pinned(key: &StateKey, registered: &Registered) -> bool {
    key.sub.is_none() && registered.contains_key(&key.resource)
}

/// Keeps the states `keep` says to; gives room back once most is free.
fn retain(store: &Store, mut keep: impl FnMut(&StateKey, &mut Entry) -> bool) {
    store.map.retain(|k, e| keep(k, e.get_mut()));
    let (len, capacity) = (store.map.len(), store.map.capacity());
    if capacity > 4096 && len < capacity / 4 {
        store.map.shrink_to_fit();
    }
}

/// Whether a state may be folded: not pinned, holding no live slot and
/// under no penalty (which no place keeps for a resource without rates).
fn foldable(k: &StateKey, e: &Entry, now: Micros, registered: &Registered) -> bool {
    let s = &e.state;
    !pinned(k, registered) && s.penalty <= now && s.leases.iter().all(|l| l.expires <= now)
}

/// Drops idle states not used within [`RECENT`]; at the bound `max`, folds
/// the least recently used down to 7/8 of it. Returns (dropped, unfoldable).
fn sweep_states(store: &Store, now: Micros, max: Option<usize>) -> (usize, usize) {
    let registered = store.registered.lock();
    let before = store.map.len();
    let mut ages = Vec::with_capacity(max.map_or(0, |_| before));
    let mut held = 0;
    retain(store, |k, e| {
        let used = e.last_used();
        if now.saturating_sub(used) >= RECENT
            && state::is_idle(&e.state, &e.spec, now)
            && !pinned(k, &registered)
        {
            return false;
        }
        match max.is_some() && foldable(k, e, now, &registered) {
            true => ages.push(used),
            false => held += 1,
        }
        true
    });
    let len = store.map.len();
    let evicted = before.saturating_sub(len);
    let Some(max) = max else {
        return (evicted, 0);
    };
    #[cfg(test)]
    {
        store.sweeper.counted.store(true, Ordering::Relaxed);
        drop(store.sweeper.after_count.lock());
    }
    let excess = len.saturating_sub(max - max / 8).min(ages.len());
    if excess == 0 {
        return (evicted, held);
    }
    let (_, &mut cutoff, _) = ages.select_nth_unstable(excess - 1);
    // Of the states used at the cutoff, only as many as make up the excess.
    let mut ties = excess - ages.iter().filter(|&&a| a < cutoff).count();
    drop(ages);
    let mut left = excess;
    retain(store, |k, e| {
        let used = e.last_used();
        if left == 0 || used > cutoff || (used == cutoff && ties == 0) {
            return true;
        }
        if !foldable(k, e, now, &registered) {
            return true;
        }
        let hash = store.hash(k.parts());
        store.spills.fold(hash, &e.state, &e.spec, now, max);
        ties -= usize::from(used == cutoff);
        left -= 1;
        false
    });
    (evicted, held)
}

/// Decides when to sweep.
#[derive(Debug, Default)]
pub(crate) struct Sweeper {
    /// States held: exact after a sweep, plus the inserts since.
    len: AtomicUsize,
    /// The number of states past which a sweep is due (0 before the first).
    threshold: AtomicUsize,
    /// The bound (0 until set: [`DEFAULT_MAX_STATES`]).
    max: AtomicUsize,
    last: AtomicU64,
    /// Held by the thread that sweeps.
    sweeping: Mutex<()>,
    /// Inserts waiting for a sweep (tests).
    #[cfg(test)]
    pub(crate) waiting: AtomicUsize,
    /// A fold waits at this lock once it has counted the states (tests).
    #[cfg(test)]
    pub(crate) after_count: Mutex<()>,
    #[cfg(test)]
    pub(crate) counted: std::sync::atomic::AtomicBool,
}

impl Sweeper {
    /// Bounds the store at `max` states (at least [`MIN_MAX_STATES`]).
    pub(crate) fn set_max(&self, max: usize) {
        let max = max.max(MIN_MAX_STATES);
        self.max.store(max, Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed);
        self.threshold
            .store((len * 2).max(MIN_SWEEP_LEN).min(max), Ordering::Relaxed);
    }

    /// The bound.
    pub(crate) fn max(&self) -> usize {
        match self.max.load(Ordering::Relaxed) {
            0 => DEFAULT_MAX_STATES,
            max => max,
        }
    }

    /// Called after each write (denials too), with no lock of the store
    /// held; `inserted` when the write created a state.
    pub(crate) fn after_write(&self, store: &Store, now: Micros, inserted: bool) {
        let len = if inserted {
            self.len.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.len.load(Ordering::Relaxed)
        };
        let max = self.max();
        if len < MIN_SWEEP_LEN.min(max) {
            return;
        }
        let grown = len > self.threshold.load(Ordering::Relaxed);
        let stale = now.saturating_sub(self.last.load(Ordering::Relaxed)) > SWEEP_INTERVAL;
        if !(grown || stale) {
            return;
        }
        match self.sweeping.try_lock() {
            Some(_sweeping) => _ = self.sweep(store, now, len),
            // An insert that finds the store an eighth past its bound while
            // another thread sweeps waits for that sweep, then sweeps if one
            // is still due: a sweep misses the states made after it counted.
            None if inserted && len >= max + max / 8 => {
                #[cfg(test)]
                self.waiting.fetch_add(1, Ordering::Relaxed);
                drop(self.sweeping.lock());
                #[cfg(test)]
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                self.after_write(store, now, false);
            }
            None => {}
        }
    }

    /// Drops idle states and empties spent places; folds when `len` states
    /// reach the bound. Returns how many idle states it dropped.
    pub(crate) fn sweep(&self, store: &Store, now: Micros, len: usize) -> usize {
        let max = self.max();
        let (evicted, held) = sweep_states(store, now, (len >= max).then_some(max));
        store.spills.drop_idle(now);
        // The next sweep is due when the map has doubled or reached the
        // bound, or, when the `held` states no fold may drop fill the bound,
        // an eighth past them.
        let kept = store.map.len();
        let next = if held + max / 8 > max {
            held + held.max(max) / 8
        } else {
            (kept * 2).max(MIN_SWEEP_LEN).min(max)
        };
        self.len.store(kept, Ordering::Relaxed);
        self.threshold.store(next, Ordering::Relaxed);
        self.last.store(now, Ordering::Relaxed);
        evicted
    }
}
