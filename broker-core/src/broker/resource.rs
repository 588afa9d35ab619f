//! The resource record: a registration's compiled limits and counters, the
//! lineage its id's registrations share, and the logging of store errors.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use arc_swap::ArcSwap;

use super::{keeper, penalties, queue};
use crate::config::ResourceConfig;
use crate::error::BackendError;
use crate::state::LimitSpec;
use crate::stats::{add, Counters, Live, ResourceKind};
use crate::store::{LocalStates, Store};

/// A registered resource: its limits compiled once, its counters. The
/// `Arc` fields belong to the resource id and are shared by all its
/// registrations.
#[derive(Debug)]
pub(crate) struct Resource {
    /// The broker's state store.
    pub(crate) backend: Arc<dyn Store>,
    /// The backend's states of this resource, when it answers without I/O.
    pub(crate) local: Option<Arc<dyn LocalStates>>,
    /// The calls waiting and the work running (or permits held) under this id.
    pub(crate) live: Arc<Live>,
    /// Set once a later registration of the id replaced this one.
    pub(crate) retired: AtomicBool,
    pub(crate) id: String,
    pub(crate) key: String,
    pub(crate) config: ResourceConfig,
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) kind: ResourceKind,
    pub(crate) counters: Counters,
    /// Wakes `enqueue` / `acquire` calls waiting for a concurrency slot.
    pub(super) slot_notify: tokio::sync::Notify,
    /// How many calls wait for a slot: a release with none skips the wake.
    pub(super) slot_waiters: AtomicU64,
    /// Penalties on attempts already booked in this process.
    pub(crate) penalties: Arc<penalties::Penalties>,
    /// The local wait queues of `enqueue`, by state key.
    pub(crate) lines: Arc<queue::Lines>,
    /// When this resource last logged a backend error at warn level (ms
    /// since the process-wide origin), `u64::MAX` for never.
    pub(crate) warned_at_ms: AtomicU64,
    /// Renews the leases of live permits, on a store whose leases expire.
    pub(crate) keeper: Option<Arc<keeper::Keeper>>,
    /// The latest registration of this id, shared by all of them: held
    /// weakly, so an old registration kept alive keeps no later one alive.
    pub(crate) lineage: Arc<ArcSwap<Latest>>,
    /// This registration's changes of limits since the first of its id.
    pub(crate) epochs: Epochs,
}

impl Resource {
    /// The latest registration under this id: a call begun under a replaced
    /// one makes its later transitions with the latest limits.
    pub(crate) fn latest(&self) -> Arc<Latest> {
        self.lineage.load_full()
    }

    /// Adds `n` to `counter` of the registration that counts what happens
    /// now to a call made on this one: itself, or the latest once replaced.
    pub(crate) fn tally(&self, counter: impl FnOnce(&Counters) -> &AtomicU64, n: u64) {
        let latest = (self.retired.load(Ordering::Acquire))
            .then(|| self.lineage.load().resource.upgrade())
            .flatten();
        add(counter(&latest.as_deref().unwrap_or(self).counters), n);
    }

    /// Wakes the calls waiting for a slot, after one was released.
    pub(crate) fn slot_freed(&self) {
        if self.slot_waiters.load(Ordering::SeqCst) > 0 {
            self.slot_notify.notify_waiters();
        }
    }
}

/// A resource logs a backend error at warn level at most once per this
/// many milliseconds; the rest go to debug level.
const BACKEND_WARN_INTERVAL_MS: u64 = 10_000;

/// Counts and logs a backend error on `resource`.
pub(crate) fn note_backend_error(resource: &Resource, op: &'static str, e: &BackendError) {
    resource.tally(|c| &c.backend_errors, 1);
    crate::telemetry::backend_error(&resource.id, op);
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let now_ms = ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64;
    let warned = &resource.warned_at_ms;
    let last = warned.load(Relaxed);
    let due = last == u64::MAX || now_ms.saturating_sub(last) >= BACKEND_WARN_INTERVAL_MS;
    if due && (warned.compare_exchange(last, now_ms, Relaxed, Relaxed)).is_ok() {
        tracing::warn!(resource = %resource.id, op, error = %e.message, "backend error");
    } else {
        tracing::debug!(resource = %resource.id, op, error = %e.message, "backend error");
    }
}

/// The latest registration of an id, as an earlier one sees it.
#[derive(Debug)]
pub(crate) struct Latest {
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) epochs: Epochs,
    pub(super) resource: std::sync::Weak<Resource>,
}

/// How many registrations of an id since its first changed its limits,
/// and how many of those its buckets (units or their number): equal epochs,
/// same limits (buckets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Epochs {
    pub(crate) limits: u64,
    pub(crate) buckets: u64,
}

impl Epochs {
    /// The epochs of a registration of `spec` over one of `before`.
    pub(crate) fn after(self, before: &Arc<LimitSpec>, spec: &Arc<LimitSpec>) -> Self {
        if Arc::ptr_eq(before, spec) || **before == **spec {
            return self;
        }
        let units = |s: &LimitSpec| s.buckets.iter().map(|(u, _)| *u).collect::<Vec<_>>();
        Self {
            limits: self.limits + 1,
            buckets: self.buckets + u64::from(units(before) != units(spec)),
        }
    }
}
