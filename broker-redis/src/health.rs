//! Reachability of Redis as the calls see it: the [`Health`] tracker that
//! logs once per outage, counts the calls refused while it lasts and keeps
//! every call from Redis while it is down (a background probe finds it
//! back, see `probe.rs`); one for a server, one per hash slot for a cluster
//! ([`Healths`]). What to answer meanwhile is the failure policy's, above
//! the store (`broker_core::Failover`).

#[cfg(feature = "cluster")]
use std::collections::HashMap;
#[cfg(feature = "cluster")]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
#[cfg(feature = "cluster")]
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use broker_core::stats::BackendHealth;

/// The part of the store a call needs, whose outage the failure policy
/// answers it through: the whole store (one server), or on a cluster the
/// hash slot of its keys (all keys of a resource share one), whose node
/// may be down while the other nodes serve their slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    /// The one server.
    Whole,
    /// One hash slot of a cluster.
    #[cfg(feature = "cluster")]
    Slot(redis::cluster_routing::Slot),
}

impl Scope {
    /// The scope of the calls on state `key` over `conn`: the slot of its
    /// hash tag, which is `key` itself (see `keys::key_pair`), on a
    /// cluster.
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) fn of(conn: &crate::connection::Conn, key: &str) -> Self {
        #[cfg(feature = "cluster")]
        if let crate::connection::Conn::Cluster(..) = conn {
            return Scope::Slot(redis::cluster_routing::Slot::for_key(key));
        }
        Scope::Whole
    }
}

/// The health of every scope a call may need: the store's as a whole,
/// and on a cluster one per hash slot that has failed a call (kept, once
/// made, so that its epoch keeps a stale failure from starting an outage
/// again; at most one per slot). A slot that never failed a call is up
/// and holds no entry, so the calls on a healthy cluster read a map and
/// write nothing. Per slot, not per node: the client does not tell which
/// node a slot's call went to, so each slot of a dead node learns of the
/// outage by a failed call of its own (one response timeout each, on a
/// frozen node), after which its calls are answered by the policy at once.
#[derive(Debug)]
pub(crate) struct Healths {
    whole: Health,
    #[cfg(feature = "cluster")]
    slots: RwLock<HashMap<redis::cluster_routing::Slot, Arc<Health>>>,
    /// How many slots are down: while none is, a call that reached Redis
    /// looks for no slot to probe (one load).
    #[cfg(feature = "cluster")]
    down_slots: AtomicUsize,
}

impl Healths {
    pub(crate) fn new(probe_interval: Duration) -> Self {
        Self {
            whole: Health::new(probe_interval, Scope::Whole),
            #[cfg(feature = "cluster")]
            slots: RwLock::default(),
            #[cfg(feature = "cluster")]
            down_slots: AtomicUsize::new(0),
        }
    }

    /// Runs `f` on the health of `scope`; for a slot that never failed a
    /// call (no health of its own: up, in epoch 0), returns `unseen`.
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    fn read<R>(&self, scope: Scope, unseen: R, f: impl FnOnce(&Health) -> R) -> R {
        match scope {
            Scope::Whole => f(&self.whole),
            #[cfg(feature = "cluster")]
            Scope::Slot(slot) => {
                let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
                match slots.get(&slot) {
                    Some(h) => f(h),
                    None => unseen,
                }
            }
        }
    }

    /// Runs `f` on the health of `scope`, made for a slot that has none.
    fn write<R>(&self, scope: Scope, f: impl FnOnce(&Health) -> R) -> R {
        match scope {
            Scope::Whole => f(&self.whole),
            // Not under the lock: `f` may log.
            #[cfg(feature = "cluster")]
            Scope::Slot(slot) => f(&self.slot(slot)),
        }
    }

    /// The health of `slot`, made if it has none.
    #[cfg(feature = "cluster")]
    fn slot(&self, slot: redis::cluster_routing::Slot) -> Arc<Health> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = slots.get(&slot) {
            return h.clone();
        }
        drop(slots);
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        let interval = self.whole.probe_interval;
        slots
            .entry(slot)
            .or_insert_with(|| Arc::new(Health::new(interval, Scope::Slot(slot))))
            .clone()
    }

    /// [`Health::should_try`] for a call on `scope` (epoch 0 for a slot
    /// that never failed a call).
    pub(crate) fn should_try(&self, scope: Scope) -> Option<Epoch> {
        self.read(scope, Some(0), Health::should_try)
    }

    /// [`Health::up`] for a call on `scope`.
    pub(crate) fn up(&self, scope: Scope) {
        // Logged at info level when the last down slot comes back (see
        // `Healths::failed`).
        #[cfg(feature = "cluster")]
        let loud = self.down_slots.load(Ordering::Relaxed) <= 1;
        #[cfg(not(feature = "cluster"))]
        let loud = true;
        let ended = self.read(scope, false, |h| h.up(loud));
        #[cfg(feature = "cluster")]
        if ended && matches!(scope, Scope::Slot(_)) {
            self.down_slots.fetch_sub(1, Ordering::Relaxed);
        }
        let _ = ended;
    }

    /// The down slots due for the background probe's `PING` now (each once
    /// per probe interval), at most [`PROBES_AT_ONCE`], the longest waiting
    /// first.
    #[cfg(feature = "cluster")]
    pub(crate) fn probes_due(&self) -> Vec<redis::cluster_routing::Slot> {
        if self.down_slots.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        let mut due: Vec<_> = slots
            .iter()
            .filter_map(|(slot, h)| h.probe_due().map(|since| (since, *slot, h)))
            .collect();
        due.sort_unstable_by_key(|(since, ..)| *since);
        due.truncate(PROBES_AT_ONCE);
        for (_, _, h) in &due {
            h.probed();
        }
        due.into_iter().map(|(_, slot, _)| slot).collect()
    }

    /// Whether any scope is down: the server, or a slot of a cluster.
    pub(crate) fn any_down(&self) -> bool {
        #[cfg(feature = "cluster")]
        if self.down_slots.load(Ordering::Relaxed) != 0 {
            return true;
        }
        self.whole.is_down()
    }

    /// [`Health::kept_back`] for a call on `scope`.
    pub(crate) fn kept_back(&self, scope: Scope) {
        self.write(scope, Health::kept_back)
    }

    /// [`Health::failed`] for a call on `scope`.
    ///
    /// On a cluster, a dead node's slots each start an outage of their
    /// own: only the first while no slot is down is logged at error level,
    /// the others at debug level, so one node's failure logs one error,
    /// not one per slot in use.
    pub(crate) fn failed(&self, scope: Scope, error: &str, epoch: Epoch) {
        #[cfg(feature = "cluster")]
        let loud = self.down_slots.load(Ordering::Relaxed) == 0;
        #[cfg(not(feature = "cluster"))]
        let loud = true;
        let started = self.write(scope, |h| h.failed(error, epoch, loud));
        #[cfg(feature = "cluster")]
        if started && matches!(scope, Scope::Slot(_)) {
            self.down_slots.fetch_add(1, Ordering::Relaxed);
        }
        let _ = started;
    }

    /// [`Health::is_down`] for `scope`.
    pub(crate) fn is_down(&self, scope: Scope) -> bool {
        self.read(scope, false, Health::is_down)
    }

    /// The health of the store: down while any scope is (a server, or a
    /// slot of a cluster), with the outages and the calls handled by the
    /// policy of every scope summed.
    pub(crate) fn snapshot(&self) -> BackendHealth {
        #[allow(unused_mut)]
        let mut all = self.whole.snapshot();
        #[cfg(feature = "cluster")]
        for h in self
            .slots
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let s = h.snapshot();
            all.down |= s.down;
            all.outages += s.outages;
            all.handled_errors += s.handled_errors;
        }
        all
    }
}

/// At most this many down slots are probed at once (see
/// [`Healths::probes_due`]); the others wait for a later probe.
#[cfg(feature = "cluster")]
const PROBES_AT_ONCE: usize = 16;

/// Reachability of the store, or of one slot of a cluster, as seen by the
/// calls.
#[derive(Debug)]
pub(crate) struct Health {
    /// What it is the health of (for the logs).
    scope: Scope,
    /// Whether the store is down (bit 0), and how many outages have ended
    /// (the rest, the epoch): one word, so that a failure can start an
    /// outage only in the epoch its call went out in (see
    /// [`Health::failed`]).
    state: AtomicU64,
    origin: Instant,
    /// Milliseconds since `origin` before which no probe is sent.
    next_probe_ms: AtomicU64,
    probe_interval: Duration,
    outages: AtomicU64,
    handled: AtomicU64,
    down_since: Mutex<Option<Instant>>,
}

/// The bit of [`Health::state`] that says the store is down.
const DOWN: u64 = 1;

/// The epoch of a [`Health::state`]: how many outages had ended.
pub(crate) type Epoch = u64;

impl Health {
    pub(crate) fn new(probe_interval: Duration, scope: Scope) -> Self {
        Self {
            scope,
            state: AtomicU64::new(0),
            origin: Instant::now(),
            next_probe_ms: AtomicU64::new(0),
            probe_interval,
            outages: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            down_since: Mutex::new(None),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A probe interval after `ms` (since `origin`), in the far future
    /// for an interval too long to add.
    fn after_interval(&self, ms: u64) -> u64 {
        let interval = u64::try_from(self.probe_interval.as_millis()).unwrap_or(u64::MAX);
        ms.saturating_add(interval)
    }

    /// Whether a call should go to Redis: `Some` with the epoch it goes out
    /// in (for [`Health::failed`]) while Redis is up; `None` while it is
    /// down (the failure policy answers; the background probe finds it back).
    pub(crate) fn should_try(&self) -> Option<Epoch> {
        let state = self.state.load(Ordering::Acquire);
        (state & DOWN == 0).then_some(state >> 1)
    }

    /// Whether this scope is down and due for a probe: at most once per
    /// probe interval (the last probe's time, for [`Healths::probes_due`]
    /// to probe the longest waiting first).
    #[cfg(feature = "cluster")]
    fn probe_due(&self) -> Option<u64> {
        if !self.is_down() {
            return None;
        }
        let now = self.elapsed_ms();
        let next = self.next_probe_ms.load(Ordering::Relaxed);
        (now >= next).then_some(next)
    }

    /// Marks this scope probed now: not due again for a probe interval.
    #[cfg(feature = "cluster")]
    fn probed(&self) {
        self.next_probe_ms
            .store(self.after_interval(self.elapsed_ms()), Ordering::Relaxed);
    }

    /// A call reached Redis: ends an outage, if there was one (whether it
    /// did).
    /// The end of an outage of a cluster's slot is logged at info level if
    /// `loud`, else at debug level.
    pub(crate) fn up(&self, loud: bool) -> bool {
        // Down: the next epoch, up.
        let ended = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & DOWN != 0).then(|| ((state >> 1) + 1) << 1)
            });
        if ended.is_err() {
            return false;
        }
        let since = self
            .down_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let down_ms = since.map_or(0, |s| s.elapsed().as_millis() as u64);
        let handled = self.handled.load(Ordering::Relaxed);
        match self.scope {
            Scope::Whole => tracing::info!(
                down_ms,
                handled,
                "redis reachable again; decisions are shared again"
            ),
            #[cfg(feature = "cluster")]
            Scope::Slot(slot) if loud => tracing::info!(
                ?slot,
                down_ms,
                handled,
                "redis cluster slot reachable again, the last one down; its decisions are shared again"
            ),
            #[cfg(feature = "cluster")]
            Scope::Slot(slot) => tracing::debug!(
                ?slot,
                down_ms,
                handled,
                "redis cluster slot reachable again; its decisions are shared again"
            ),
        }
        let _ = loud;
        true
    }

    /// A call kept from trying (Redis is down): counted
    /// as handled by the policy.
    pub(crate) fn kept_back(&self) {
        self.handled.fetch_add(1, Ordering::Relaxed);
    }

    /// Redis could not be reached by a call that went out in `epoch` (see
    /// [`Health::should_try`]). Starts an outage on the first failure and
    /// logs it once; counts the call as handled by the policy. A failure
    /// of a call that went out before the latest outage ended is stale (a
    /// call since reached Redis): it starts no outage, and a call that
    /// goes out now finds out for itself. Whether it started one.
    /// The start of an outage of a cluster's slot is logged at error level
    /// if `loud`, else at debug level.
    pub(crate) fn failed(&self, error: &str, epoch: Epoch, loud: bool) -> bool {
        self.kept_back();
        // Only from up in the call's own epoch: not again while down, nor
        // after a recovery the call went out before.
        let up = epoch << 1;
        if self
            .state
            .compare_exchange(up, up | DOWN, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        *self.down_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.next_probe_ms
            .store(self.after_interval(self.elapsed_ms()), Ordering::Relaxed);
        self.outages.fetch_add(1, Ordering::Relaxed);
        match self.scope {
            Scope::Whole => tracing::error!(
                error,
                "redis unreachable; the failure policy answers until it returns"
            ),
            #[cfg(feature = "cluster")]
            Scope::Slot(slot) if loud => tracing::error!(
                ?slot,
                error,
                "redis cluster slot unreachable; the failure policy answers its keys until it returns \
                 (other slots that go down while one is are logged at debug level)"
            ),
            #[cfg(feature = "cluster")]
            Scope::Slot(slot) => tracing::debug!(
                ?slot,
                error,
                "redis cluster slot unreachable; the failure policy answers its keys until it returns"
            ),
        }
        let _ = loud;
        true
    }

    /// Whether the store is down (an outage has started and not ended).
    pub(crate) fn is_down(&self) -> bool {
        self.state.load(Ordering::Relaxed) & DOWN != 0
    }

    pub(crate) fn snapshot(&self) -> BackendHealth {
        BackendHealth {
            down: self.is_down(),
            outages: self.outages.load(Ordering::Relaxed),
            handled_errors: self.handled.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_outage_is_logged_and_counted_once() {
        let h = Health::new(Duration::from_secs(3600), Scope::Whole);
        let epoch = h.should_try().expect("up: every call goes out");
        h.failed("refused", epoch, true);
        h.failed("refused", epoch, true);
        assert!(h.should_try().is_none(), "down: no call goes out");
        h.kept_back();
        let s = h.snapshot();
        assert_eq!((s.down, s.outages, s.handled_errors), (true, 1, 3));
        h.up(true);
        assert!(h.should_try().is_some());
        assert!(!h.snapshot().down);
    }

    /// On a cluster, an outage is one slot's: the other slots' calls go
    /// out, and the backend reads as down while any slot is.
    #[cfg(feature = "cluster")]
    #[test]
    fn an_outage_of_one_slot_leaves_the_others_up() {
        use redis::cluster_routing::Slot;
        let h = Healths::new(Duration::from_secs(3600));
        let (dead, live) = (
            Scope::Slot(Slot::for_key("a")),
            Scope::Slot(Slot::for_key("b")),
        );
        assert_ne!(dead, live);
        let epoch = h.should_try(dead).expect("up");
        h.failed(dead, "no reply in time", epoch);
        assert!(h.should_try(dead).is_none(), "down: no call goes out");
        assert!(h.is_down(dead) && !h.is_down(live));
        assert_eq!(h.should_try(live), Some(0));
        h.up(live);
        let s = h.snapshot();
        assert_eq!((s.down, s.outages, s.handled_errors), (true, 1, 1));
        h.up(dead);
        assert!(!h.snapshot().down);
        assert_eq!(h.should_try(dead), Some(1), "the slot's next epoch");
    }

    /// A down slot is due for a probe once per probe interval, and not
    /// after its outage ended; no slot is while none is down.
    #[cfg(feature = "cluster")]
    #[test]
    fn a_down_slot_is_probed_once_per_interval() {
        use redis::cluster_routing::Slot;
        let h = Healths::new(Duration::from_millis(50));
        let dead = Slot::for_key("a");
        assert!(h.probes_due().is_empty(), "none is down");
        let epoch = h.should_try(Scope::Slot(dead)).expect("up");
        h.failed(Scope::Slot(dead), "no reply in time", epoch);
        assert!(h.probes_due().is_empty(), "not before the interval");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(h.probes_due(), [dead]);
        assert!(h.probes_due().is_empty(), "once per interval");
        h.up(Scope::Slot(dead));
        std::thread::sleep(Duration::from_millis(60));
        assert!(h.probes_due().is_empty(), "up again");
        assert!(!h.snapshot().down);
    }

    /// A failure of a call that went out before a recovery (a call behind
    /// the one that timed out, answered by the policy; one in flight when
    /// the probe found Redis back) ends no outage and starts none; one
    /// that went out after it starts the next.
    #[test]
    fn a_failure_from_before_a_recovery_starts_no_outage() {
        let h = Health::new(Duration::ZERO, Scope::Whole);
        let before = h.should_try().expect("up");
        h.failed("no reply in time", before, true);
        assert!(h.should_try().is_none(), "down: no call goes out");
        h.up(true);
        h.failed("queued behind the timeout", before, true);
        let s = h.snapshot();
        assert_eq!((s.down, s.outages, s.handled_errors), (false, 1, 2));
        let after = h.should_try().expect("up again");
        assert_ne!(after, before);
        h.failed("refused", after, true);
        let s = h.snapshot();
        assert_eq!((s.down, s.outages), (true, 2), "a new outage");
    }
}
