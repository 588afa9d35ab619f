//! [`Keeper`]: renews the leases this process holds on a store whose
//! leases expire (Redis), each every third of its resource's `lease_ttl`,
//! so that a hold longer than the TTL (a long LLM call, a response body
//! sent for minutes) keeps its slot, while the lease of a holder that
//! died is no longer renewed and expires as before.
//!
//! A permit holding such a lease is kept from its making to its release
//! (see `permit.rs`). One task per broker renews them, on the tokio
//! runtime the first of them was made on; it runs while leases are kept.
//! A permit made outside a runtime is not kept: its lease lives for its
//! TTL, as a lease always did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Resource;
use crate::backend::Backend;
use crate::state::{LeaseId, LimitSpec};

/// The leases kept, and the renewing task's state.
pub(crate) struct Keeper {
    backend: Arc<dyn Backend>,
    held: Mutex<Held>,
    /// Wakes the task when a lease is kept, which may be due before the
    /// task's next wake-up (a resource with a shorter TTL).
    kept: Notify,
}

#[derive(Default)]
struct Held {
    leases: HashMap<LeaseId, Kept>,
    /// Whether the renewing task runs. It stops once no lease is kept.
    running: bool,
}

/// One lease kept: its state, the limits it was taken under (its TTL),
/// and when to renew it next.
struct Kept {
    resource: Arc<Resource>,
    key: String,
    spec: Arc<LimitSpec>,
    due: Instant,
}

/// The shortest time between two renewals of one lease.
const MIN_EVERY: Duration = Duration::from_millis(10);

/// How often a lease taken under `spec` is renewed: three times per TTL,
/// so that one late or failed renewal does not let it expire.
fn every(spec: &LimitSpec) -> Duration {
    (Duration::from_micros(spec.lease_ttl) / 3).max(MIN_EVERY)
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("leases", &self.lock().leases.len())
            .finish_non_exhaustive()
    }
}

impl Keeper {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            held: Mutex::new(Held::default()),
            kept: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Renews `lease`, taken under the latest limits of `resource` on the
    /// state at `key`, until it is forgotten; nothing outside a tokio
    /// runtime.
    pub(crate) fn keep(self: &Arc<Self>, resource: &Arc<Resource>, key: String, lease: LeaseId) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let spec = resource.latest().spec.clone();
        let kept = Kept {
            resource: resource.clone(),
            key,
            due: Instant::now() + every(&spec),
            spec,
        };
        let start = {
            let mut held = self.lock();
            held.leases.insert(lease, kept);
            !std::mem::replace(&mut held.running, true)
        };
        if start {
            // Spawned with the lock let go: a runtime shutting down drops
            // the task at once, and its guard takes the lock to say so.
            let stopped = Stopped {
                keeper: self.clone(),
                armed: true,
            };
            runtime.spawn(renew_while_kept(stopped));
        }
        self.kept.notify_one();
    }

    /// Stops renewing `lease` (its permit is being released).
    pub(crate) fn forget(&self, lease: LeaseId) {
        self.lock().leases.remove(&lease);
    }
}

/// The renewing task's hold on its keeper: clears [`Held::running`] when
/// the task is dropped before it finished (its runtime shut down, maybe
/// before it ever ran), so that the next `keep` starts another; disarmed
/// when the task stops by itself.
struct Stopped {
    keeper: Arc<Keeper>,
    armed: bool,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if self.armed {
            self.keeper.lock().running = false;
        }
    }
}

/// Renews every kept lease when it is due, until none is kept.
async fn renew_while_kept(mut stopped: Stopped) {
    let keeper = stopped.keeper.clone();
    loop {
        let now = Instant::now();
        let (due, next) = {
            let mut held = keeper.lock();
            if held.leases.is_empty() {
                held.running = false;
                stopped.armed = false;
                return;
            }
            let mut due = Vec::new();
            for (lease, kept) in held.leases.iter_mut() {
                if kept.due <= now {
                    let renewal = (kept.resource.clone(), kept.key.clone(), kept.spec.clone());
                    due.push((*lease, renewal));
                    kept.due = now + every(&kept.spec);
                }
            }
            let next = held.leases.values().map(|k| k.due).min();
            (due, next.unwrap_or(now))
        };
        for (lease, (resource, key, spec)) in due {
            match keeper.backend.renew(&key, &spec, lease).await {
                Ok(true) => {}
                // Not in the store while its permit lives: it expired
                // before a renewal reached the store (the store was out of
                // reach for longer than the TTL), it was lost with the
                // store's data (a restart, a failover), or it was granted
                // while the store was out of reach and its failure policy
                // let the call through. Taken again if a slot is free, so
                // the store counts the work running; else its slot is
                // another holder's.
                Ok(false) => match keeper.backend.retake(&key, &spec, lease).await {
                    // Its permit was released meanwhile (it was forgotten
                    // before its release was sent, so that release may
                    // have gone out before the retake): freed again here.
                    Ok(true) if !keeper.lock().leases.contains_key(&lease) => {
                        if let Err(e) = keeper.backend.release(&key, lease).await {
                            super::note_backend_error(&resource, "release", &e);
                        }
                    }
                    Ok(true) => tracing::warn!(
                        resource = %resource.id,
                        "a concurrency lease was not in the store while its permit is held \
                         (it expired, was lost with the store's data, or was granted while \
                         the store was unreachable) and is taken again; the limit may have \
                         been exceeded meanwhile"
                    ),
                    Ok(false) => {
                        if keeper.lock().leases.remove(&lease).is_some() {
                            tracing::warn!(
                                resource = %resource.id,
                                "a concurrency lease is not in the store while its permit is \
                                 held (it expired, was lost with the store's data, or was \
                                 granted while the store was unreachable) and every slot is \
                                 taken; the limit may be exceeded until the permit is released"
                            );
                        }
                    }
                    // Tried again at the next renewal.
                    Err(e) => super::note_backend_error(&resource, "retake", &e),
                },
                Err(e) => super::note_backend_error(&resource, "renew", &e),
            }
        }
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = keeper.kept.notified() => {}
        }
    }
}
