//! [`Keeper`]: renews held leases on a store whose leases expire, every
//! third of `lease_ttl`, for `max_hold` at most: one task per runtime, whose
//! leases go to another runtime's task (or the next) when it shuts down.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use scopeguard::ScopeGuard;
use tokio::runtime::Id;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Resource;
use crate::state::{LeaseId, LimitSpec};
use crate::store::{Renewal, Store};

/// The leases kept, each with the runtime whose task renews it, and the
/// releases not yet sent (see `pending.rs`).
pub(crate) struct Keeper {
    pub(super) backend: Arc<dyn Store>,
    held: Mutex<Held>,
    /// How many leases `by_key` holds: a decision finds none without the
    /// lock.
    pub(super) count: AtomicUsize,
    pub(super) by_key: Mutex<HashMap<String, Vec<LeaseId>>>,
    /// Held by the one task that reads the store's health while releases
    /// wait for it to read up.
    pub(super) reader: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Held {
    leases: HashMap<LeaseId, Kept>,
    /// The runtimes with a renewing task, and what wakes it when a lease is
    /// kept (it may be due sooner). A task stops, and its runtime leaves,
    /// once it renews none.
    runtimes: HashMap<Id, Arc<Notify>>,
}

/// One lease kept: the runtime whose task renews it (`None`: lost with its
/// runtime while no other ran), when to renew it next, and when to stop
/// (`None`: never).
struct Kept {
    on: Option<Id>,
    resource: Arc<Resource>,
    key: String,
    spec: Arc<LimitSpec>,
    due: Instant,
    until: Option<Instant>,
}

/// Moves the leases of runtime `from` to runtime `to`.
fn hand_on(leases: &mut HashMap<LeaseId, Kept>, from: Option<Id>, to: Option<Id>) {
    for kept in leases.values_mut().filter(|k| k.on == from) {
        kept.on = to;
    }
}

/// The shortest time between two renewals of one lease.
const MIN_EVERY: Duration = Duration::from_millis(10);

/// The shortest lease TTL on a store whose leases expire: renewed three
/// times per TTL at [`MIN_EVERY`].
pub(crate) const MIN_LEASE_TTL: Duration = MIN_EVERY.saturating_mul(3);

/// How often a lease taken under `spec` is renewed: three times per TTL.
fn every(spec: &LimitSpec) -> Duration {
    (Duration::from_micros(spec.lease_ttl) / 3).max(MIN_EVERY)
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").finish_non_exhaustive()
    }
}

impl Keeper {
    pub(crate) fn new(backend: Arc<dyn Store>) -> Self {
        Self {
            backend,
            held: Mutex::default(),
            count: AtomicUsize::new(0),
            by_key: Mutex::default(),
            reader: tokio::sync::Mutex::new(()),
        }
    }

    /// Renews `lease` on state `key` until it is forgotten or `max_hold`
    /// has passed, from the current runtime's task (none outside one).
    pub(crate) fn keep(self: &Arc<Self>, resource: &Arc<Resource>, key: String, lease: LeaseId) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let id = runtime.id();
        let spec = resource.latest().spec.clone();
        let now = Instant::now();
        let kept = Kept {
            on: Some(id),
            resource: resource.clone(),
            key,
            due: now + every(&spec),
            until: now.checked_add(resource.config.max_hold),
            spec,
        };
        let (notify, start) = {
            let mut held = self.held.lock();
            let start = !held.runtimes.contains_key(&id);
            if start {
                hand_on(&mut held.leases, None, Some(id));
            }
            held.leases.insert(lease, kept);
            (held.runtimes.entry(id).or_default().clone(), start)
        };
        if start {
            // Spawned with the lock let go: a runtime shutting down drops
            // the task at once, and its guard takes the lock.
            let stopped = scopeguard::guard(self.clone(), move |keeper| keeper.runtime_gone(id));
            runtime.spawn(renew_while_kept(stopped, id, notify.clone()));
        }
        notify.notify_one();
    }

    /// Stops renewing `lease` (its permit is being released).
    pub(crate) fn forget(&self, lease: LeaseId) {
        self.held.lock().leases.remove(&lease);
    }

    /// Takes out runtime `id`, whose renewing task was dropped unfinished
    /// (its runtime shut down), and hands its leases on.
    fn runtime_gone(&self, id: Id) {
        let mut held = self.held.lock();
        if held.runtimes.remove(&id).is_some() {
            let other = (held.runtimes.iter().next()).map(|(other, wake)| {
                wake.notify_one();
                *other
            });
            hand_on(&mut held.leases, Some(id), other);
        }
    }
}

/// Renews the leases kept on runtime `id` when due, until none is left;
/// dropped unfinished, `stopped` takes the runtime out.
async fn renew_while_kept(
    stopped: ScopeGuard<Arc<Keeper>, impl FnOnce(Arc<Keeper>) + Send>,
    id: Id,
    kept: Arc<Notify>,
) {
    let keeper = Arc::clone(&stopped);
    loop {
        let now = Instant::now();
        let (due, ended, next) = {
            let mut held = keeper.held.lock();
            let ours = held.leases.values().any(|k| k.on == Some(id));
            if !ours || !held.runtimes.contains_key(&id) {
                held.runtimes.remove(&id);
                ScopeGuard::into_inner(stopped);
                return;
            }
            let (mut due, mut ended, mut next) = (Vec::new(), Vec::new(), None::<Instant>);
            held.leases.retain(|lease, kept| {
                if kept.on != Some(id) {
                    return true;
                }
                if kept.until.is_some_and(|until| until <= now) {
                    ended.push(kept.resource.clone());
                    return false;
                }
                if kept.due <= now {
                    let renewal = (kept.resource.clone(), kept.key.clone(), kept.spec.clone());
                    due.push((*lease, renewal));
                    kept.due = now + every(&kept.spec);
                }
                let at = kept.until.map_or(kept.due, |until| kept.due.min(until));
                next = Some(next.map_or(at, |n| n.min(at)));
                true
            });
            (due, ended, next.unwrap_or(now))
        };
        for resource in ended {
            tracing::warn!(
                resource = %resource.id,
                max_hold = ?resource.config.max_hold,
                "a permit was held past maxHold (never released, or forgotten with \
                 std::mem::forget): its concurrency lease is no longer renewed and expires \
                 within leaseTtl, when its slot may go to another holder"
            );
        }
        for (lease, (resource, key, spec)) in due {
            match keeper.backend.renew(&key, &spec, lease).await {
                Ok(Renewal::Held) => {}
                // Taken again, but its permit was released meanwhile (the
                // release may have gone out first): freed again.
                Ok(Renewal::Retaken) if !keeper.held.lock().leases.contains_key(&lease) => {
                    if let Err(e) = keeper.backend.release(&key, lease).await {
                        super::note_backend_error(&resource, "release", &e);
                    }
                }
                Ok(Renewal::Retaken) => tracing::warn!(
                    resource = %resource.id,
                    "a concurrency lease was not in the store while its permit is held \
                     (it expired, was lost with the store's data, or was granted while \
                     the store was unreachable) and is taken again; the limit may have \
                     been exceeded meanwhile"
                ),
                Ok(Renewal::Gone) => {
                    if keeper.held.lock().leases.remove(&lease).is_some() {
                        tracing::warn!(
                            resource = %resource.id,
                            "a concurrency lease is not in the store while its permit is \
                             held (it expired, was lost with the store's data, or was \
                             granted while the store was unreachable) and every slot is \
                             taken; the limit may be exceeded until the permit is released"
                        );
                    }
                }
                Err(e) => super::note_backend_error(&resource, "renew", &e),
            }
        }
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = kept.notified() => {}
        }
    }
}
