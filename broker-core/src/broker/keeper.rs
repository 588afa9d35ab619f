//! [`Keeper`]: renews the leases this process holds on a store whose
//! leases expire (Redis), each every third of its `lease_ttl`, for its
//! resource's `max_hold` at most. One task per runtime renews the leases
//! of the permits made on it; when a runtime shuts down its leases go to
//! another runtime's task, or to the next one started.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::Id;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Resource;
use crate::state::{LeaseId, LimitSpec};
use crate::store::{Renewal, Store};

/// The leases kept, by the runtime whose task renews them.
pub(crate) struct Keeper {
    backend: Arc<dyn Store>,
    held: Mutex<Held>,
    /// The releases not yet sent.
    pub(crate) pending: Arc<super::pending::Pending>,
}

#[derive(Default)]
struct Held {
    /// A task stops, and its runtime leaves, once it renews none.
    runtimes: Vec<OnRuntime>,
    /// Leases whose task was lost with its runtime while no other ran.
    orphans: HashMap<LeaseId, Kept>,
}

/// A runtime's renewing task and the leases it renews.
struct OnRuntime {
    id: Id,
    leases: HashMap<LeaseId, Kept>,
    /// Wakes the task when a lease is kept (it may be due sooner).
    kept: Arc<Notify>,
}

impl Held {
    fn at(&self, id: Id) -> Option<usize> {
        self.runtimes.iter().position(|r| r.id == id)
    }

    fn on(&mut self, id: Id) -> Option<&mut OnRuntime> {
        self.at(id).map(|i| &mut self.runtimes[i])
    }

    fn keeps(&self, lease: LeaseId) -> bool {
        self.orphans.contains_key(&lease)
            || self.runtimes.iter().any(|r| r.leases.contains_key(&lease))
    }

    /// Stops keeping `lease`: whether it was kept.
    fn remove(&mut self, lease: LeaseId) -> bool {
        self.orphans.remove(&lease).is_some()
            || self
                .runtimes
                .iter_mut()
                .any(|r| r.leases.remove(&lease).is_some())
    }
}

/// One lease kept: when to renew it next, and when to stop (`None`: never).
struct Kept {
    resource: Arc<Resource>,
    key: String,
    spec: Arc<LimitSpec>,
    due: Instant,
    until: Option<Instant>,
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
            pending: Arc::new(super::pending::Pending::new(backend.clone())),
            backend,
            held: Mutex::new(Held::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
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
            resource: resource.clone(),
            key,
            due: now + every(&spec),
            until: now.checked_add(resource.config.max_hold),
            spec,
        };
        let (notify, start) = {
            let mut guard = self.lock();
            let held = &mut *guard;
            let start = held.on(id).is_none();
            if start {
                held.runtimes.push(OnRuntime {
                    id,
                    leases: std::mem::take(&mut held.orphans),
                    kept: Arc::new(Notify::new()),
                });
            }
            let on = held.on(id).expect("pushed above");
            on.leases.insert(lease, kept);
            (on.kept.clone(), start)
        };
        if start {
            // Spawned with the lock let go: a runtime shutting down drops
            // the task at once, and its guard takes the lock.
            let stopped = Stopped {
                keeper: self.clone(),
                id,
                armed: true,
            };
            runtime.spawn(renew_while_kept(stopped, notify.clone()));
        }
        notify.notify_one();
    }

    /// Stops renewing `lease` (its permit is being released).
    pub(crate) fn forget(&self, lease: LeaseId) {
        self.lock().remove(lease);
    }
}

/// Dropped with a renewing task that did not finish (its runtime shut
/// down): takes the runtime out and hands its leases on. Disarmed when the
/// task stops by itself.
struct Stopped {
    keeper: Arc<Keeper>,
    id: Id,
    armed: bool,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let wake = {
            let mut guard = self.keeper.lock();
            let held = &mut *guard;
            let Some(at) = held.at(self.id) else {
                return;
            };
            let gone = held.runtimes.swap_remove(at);
            match held.runtimes.first_mut() {
                Some(other) => {
                    other.leases.extend(gone.leases);
                    Some(other.kept.clone())
                }
                None => {
                    held.orphans.extend(gone.leases);
                    None
                }
            }
        };
        if let Some(other) = wake {
            other.notify_one();
        }
    }
}

/// Renews the leases kept on its runtime when due, until none is left.
async fn renew_while_kept(mut stopped: Stopped, kept: Arc<Notify>) {
    let keeper = stopped.keeper.clone();
    let id = stopped.id;
    loop {
        let now = Instant::now();
        let (due, ended, next) = {
            let mut guard = keeper.lock();
            let held = &mut *guard;
            let Some(at) = held.at(id) else {
                stopped.armed = false;
                return;
            };
            let on = &mut held.runtimes[at];
            if on.leases.is_empty() {
                held.runtimes.swap_remove(at);
                stopped.armed = false;
                return;
            }
            let (mut due, mut ended) = (Vec::new(), Vec::new());
            on.leases.retain(|lease, kept| {
                if kept.until.is_some_and(|until| until <= now) {
                    ended.push(kept.resource.clone());
                    return false;
                }
                if kept.due <= now {
                    let renewal = (kept.resource.clone(), kept.key.clone(), kept.spec.clone());
                    due.push((*lease, renewal));
                    kept.due = now + every(&kept.spec);
                }
                true
            });
            let next = (on.leases.values())
                .map(|k| k.until.map_or(k.due, |until| k.due.min(until)))
                .min();
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
                Ok(Renewal::Retaken) if !keeper.lock().keeps(lease) => {
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
                    if keeper.lock().remove(lease) {
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
