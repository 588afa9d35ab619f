//! The resource record: a registration's compiled limits, counters and
//! slot waiters, and the logging of a store's errors on it.

use std::sync::Arc;

use super::lineage::{Epochs, Latest, Lineage};
use super::{keeper, penalties, queue};
use crate::config::ResourceConfig;
use crate::error::{BackendError, BrokerError};
use crate::limits::{Cost, Limits};
use crate::state::LimitSpec;
use crate::stats::{bump, Counters, ResourceKind, ResourceStats};
use crate::store::LocalStates;

/// A registered resource: its limits compiled once, its counters.
#[derive(Debug)]
pub(crate) struct Resource {
    /// The backend's states of this resource, when it answers without I/O
    /// (see [`LocalStore::states`](crate::LocalStore::states)).
    pub(crate) local: Option<Arc<dyn LocalStates>>,
    /// The largest cost of each unit that can ever fit (the smallest burst
    /// of the limits counting it): a cost within it passes
    /// `Limits::check_fits`.
    pub(crate) fits: Cost,
    /// How many calls are in `enqueue::wait_slot` now.
    pub(super) slot_waiters: std::sync::atomic::AtomicUsize,
    /// The calls waiting and the work running (or permits held) under
    /// this id, shared by its registrations (a permit counts itself in
    /// flight here).
    pub(crate) live: Arc<crate::stats::Live>,
    /// Set once a registration under the same id replaced this resource:
    /// a [`ResourceHandle`] holding it then goes through the registry.
    pub(crate) retired: std::sync::atomic::AtomicBool,
    pub(crate) id: String,
    pub(crate) key: String,
    pub(crate) config: ResourceConfig,
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) kind: ResourceKind,
    pub(crate) counters: Counters,
    /// Wakes `enqueue` / `acquire` calls waiting for a concurrency slot;
    /// notified only while `slot_waiters` says someone waits.
    pub(super) slot_notify: tokio::sync::Notify,
    /// Penalties on attempts already booked in this process (`penalties.rs`),
    /// shared by every registration of this id.
    pub(crate) penalties: Arc<penalties::Penalties>,
    /// The local wait queues of `enqueue`, by state key, shared by every
    /// registration of this id.
    pub(crate) lines: Arc<queue::Lines>,
    /// When this resource last logged a backend error at warn level (ms
    /// since the process-wide origin), `u64::MAX` for never.
    pub(crate) warned_at_ms: std::sync::atomic::AtomicU64,
    /// Renews the leases of this resource's live permits, on a store whose
    /// leases expire (see `keeper.rs`).
    pub(crate) keeper: Option<Arc<keeper::Keeper>>,
    /// The latest registration of this id, shared by all its
    /// registrations.
    pub(crate) lineage: Arc<Lineage>,
    /// This registration's changes of limits since the first of its id.
    pub(crate) epochs: Epochs,
}

/// The registration whose counters count an event of a call (see
/// [`Resource::tally`]).
pub(crate) enum Tally<'r> {
    /// The registration the call was made on, still the latest.
    Own(&'r Resource),
    /// The latest, which replaced it.
    Latest(Arc<Resource>),
}

impl std::ops::Deref for Tally<'_> {
    type Target = Resource;

    fn deref(&self) -> &Resource {
        match self {
            Tally::Own(r) => r,
            Tally::Latest(r) => r,
        }
    }
}

impl Resource {
    /// The latest registration under this resource's id: its own, or that
    /// of the one that replaced it (and so on). A call that began under a
    /// replaced registration makes its later transitions (its refund, its
    /// settlement, a retry's booking, a penalty) with the latest limits: a
    /// store keeps a state for one set of limits, and one made for other
    /// buckets starts afresh (but for a penalty, see
    /// [`crate::state::adopt`]), so transitions under two sets in turn
    /// would start it afresh again and again.
    pub(crate) fn latest(&self) -> Arc<Latest> {
        self.lineage.latest.load_full()
    }

    /// The registration whose counters count what happens now to a call
    /// made on this one: itself, or, once a registration replaced it, the
    /// latest, so that the stats the broker reports (those of the latest)
    /// count every event after it, as the metrics (by id) do.
    pub(crate) fn tally(&self) -> Tally<'_> {
        if !self.retired.load(std::sync::atomic::Ordering::Acquire) {
            return Tally::Own(self);
        }
        match self.lineage.latest.load().resource.upgrade() {
            Some(latest) => Tally::Latest(latest),
            None => Tally::Own(self),
        }
    }

    /// The counters of this registration; `queued` and `in_flight` count
    /// the calls waiting and the work running (or permits held) on every
    /// registration of the id, also on one this one replaced: those are
    /// still queued and in flight under this id.
    pub(super) fn stats(&self) -> ResourceStats {
        ResourceStats {
            queue: self.lines.stats(),
            ..self.counters.snapshot(self.kind, &self.live)
        }
    }

    /// `config.limits.check_fits`, answered from `fits` when it passes.
    pub(crate) fn check_fits(&self, cost: Cost) -> Result<(), BrokerError> {
        if self.fits(cost) {
            return Ok(());
        }
        self.check_fits_slow(cost)
    }

    /// Whether `cost` passes `config.limits.check_fits`.
    pub(crate) fn fits(&self, cost: Cost) -> bool {
        cost.requests <= self.fits.requests && cost.tokens <= self.fits.tokens
    }

    fn check_fits_slow(&self, cost: Cost) -> Result<(), BrokerError> {
        self.config.limits.check_fits(&self.id, cost)
    }
}

/// Waiting for a freed concurrency slot. A waiter is counted before its
/// first attempt to take a slot, so a release either happens before that
/// attempt (which then sees the free slot) or sees the count and notifies.
impl Resource {
    /// After a slot was released: wakes the waiters, if any (the common
    /// case, none, costs one atomic load instead of the notifier's lock).
    pub(crate) fn slot_freed(&self) {
        if self.slot_waiters.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            self.slot_notify.notify_waiters();
        }
    }

    /// Counts the caller as a slot waiter until the guard is dropped.
    pub(crate) fn wait_for_slots(&self) -> SlotWaiter<'_> {
        self.slot_waiters
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SlotWaiter(self)
    }

    /// A future that completes at the next [`Resource::slot_freed`] with
    /// waiters.
    pub(crate) fn slot_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.slot_notify.notified()
    }
}

/// A counted slot waiter (see [`Resource::wait_for_slots`]).
pub(crate) struct SlotWaiter<'r>(&'r Resource);

impl Drop for SlotWaiter<'_> {
    fn drop(&mut self) {
        self.0
            .slot_waiters
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The largest cost of each unit that `limits` can ever grant.
pub(super) fn largest_fit(limits: &Limits) -> Cost {
    let smallest = |unit| {
        limits
            .rates
            .iter()
            .filter(|r| r.unit == unit)
            .map(|r| r.burst())
            .min()
            .unwrap_or(u64::MAX)
    };
    Cost {
        requests: smallest(crate::limits::Unit::Requests),
        tokens: smallest(crate::limits::Unit::Tokens),
    }
}

/// A resource logs a backend error at warn level at most once per this
/// many milliseconds; the rest go to debug level. During an outage every
/// call fails, and the backend already logs the outage once.
const BACKEND_WARN_INTERVAL_MS: u64 = 10_000;

pub(crate) fn note_backend_error(resource: &Resource, op: &'static str, e: &BackendError) {
    use std::sync::atomic::Ordering;
    bump(&resource.tally().counters.backend_errors);
    crate::telemetry::backend_error(&resource.id, op);
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let now_ms = ORIGIN
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64;
    let last = resource.warned_at_ms.load(Ordering::Relaxed);
    let due = last == u64::MAX || now_ms.saturating_sub(last) >= BACKEND_WARN_INTERVAL_MS;
    if due
        && resource
            .warned_at_ms
            .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(resource = %resource.id, op, error = %e.message, "backend error");
    } else {
        tracing::debug!(resource = %resource.id, op, error = %e.message, "backend error");
    }
}
