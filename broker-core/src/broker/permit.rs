//! The answer of `try_acquire` / `acquire`, and the [`Permit`] that holds a
//! concurrency slot until it is released or dropped.

use std::sync::Arc;
use std::time::Duration;

use super::Resource;
use crate::error::BackendError;
use crate::state::{DenyReason, LeaseId, Marks};
use crate::stats::{bump, drop_one};
use crate::store::Store;

/// The answer of [`crate::ResourceBroker::try_acquire`] and
/// [`crate::ResourceBroker::acquire`].
#[derive(Debug)]
#[must_use = "dropping the acquisition releases its permit at once"]
pub struct Acquisition {
    /// Whether the cost was granted.
    pub allowed: bool,
    /// When denied by rate: how long until it would fit.
    pub wait_time: Duration,
    /// Why it was denied.
    pub denied_by: Option<DenyReason>,
    /// Holds the concurrency slot, if the resource has a concurrency limit.
    /// Release it (or drop it) when the work is done. A no-op when denied.
    pub permit: Permit,
    /// Whether a shared store's failure policy answered, so that the cost
    /// is not in the store.
    pub answered_here: bool,
}

impl Acquisition {
    /// Where this acquisition's cost went, for
    /// [`crate::ResourceBroker::settle`]: `None` for the store,
    /// [`Marks::ANSWERED_HERE`] when the store's failure policy answered.
    pub fn settle_marks(&self) -> Option<Marks> {
        self.answered_here.then_some(Marks::ANSWERED_HERE)
    }
}

/// A held concurrency slot, released by [`Permit::release`] or on drop;
/// empty without a concurrency limit or when denied. A forgotten permit's
/// lease is renewed for [`max_hold`](crate::ResourceConfig::max_hold) at most.
#[derive(Debug, Default)]
#[must_use = "dropping a permit releases it at once"]
pub struct Permit(Option<Box<Lease>>);

#[derive(Debug)]
struct Lease {
    resource: Arc<Resource>,
    key: HeldKey,
    lease: LeaseId,
    /// Counted in the resource's `in_flight`.
    counted: bool,
    /// A permit joined to this one, released with it (see [`Permit::join`]).
    joined: Permit,
}

/// The state a lease is held on.
#[derive(Debug)]
pub(crate) enum HeldKey {
    /// Sub-key `k` (as the caller gave it; `None`: the resource's own) of
    /// the resource's in-process states.
    Sub(Option<Box<str>>),
    /// A state key built by [`crate::keys`] (`None`: the resource's own).
    State(Option<String>),
}

impl std::fmt::Debug for dyn Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Permit {
    /// A permit that holds nothing.
    pub const fn empty() -> Self {
        Self(None)
    }

    /// The permit of `lease`, counted in flight if `counted`, and kept
    /// renewed on a store whose leases expire.
    pub(crate) fn held(
        resource: Arc<Resource>,
        key: HeldKey,
        lease: LeaseId,
        counted: bool,
    ) -> Self {
        if counted {
            bump(&resource.live.in_flight);
        }
        // A store with a keeper has no in-process states: the key is built.
        if let (Some(keeper), HeldKey::State(on)) = (&resource.keeper, &key) {
            let on = on.clone().unwrap_or_else(|| resource.key.clone());
            keeper.keep(&resource, on, lease);
        }
        let lease = Lease {
            resource,
            key,
            lease,
            counted,
            joined: Permit::empty(),
        };
        Self(Some(Box::new(lease)))
    }

    /// One permit holding the slots of both `self` and `other`, released
    /// together (joined with an empty permit, a permit stays as it is).
    ///
    /// ```
    /// use broker_core::{Cost, Limits, ResourceBroker};
    /// # async fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("route", Limits::new().max_concurrent(10))?;
    /// broker.register_limit("files", Limits::new().max_concurrent(2))?;
    /// let route = broker.try_acquire("route", Cost::default()).await?;
    /// let files = broker.try_acquire("files", Cost::default()).await?;
    /// if route.allowed && files.allowed {
    ///     let both = route.permit.join(files.permit);
    ///     // ... the work; dropping `both` releases both slots.
    ///     drop(both);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn join(mut self, other: Permit) -> Permit {
        match &mut self.0 {
            None => other,
            Some(lease) => {
                lease.joined = std::mem::take(&mut lease.joined).join(other);
                self
            }
        }
    }

    /// Whether this permit holds a slot.
    pub fn is_held(&self) -> bool {
        self.0.is_some()
    }

    /// Releases the slot (idempotent): at once in memory, else sent on the
    /// current tokio runtime (without one, the lease expires).
    pub fn release(&mut self) {
        if let Some(l) = self.0.take() {
            release(l.resource, l.key, l.lease, l.counted);
            drop(l.joined);
        }
    }
}

/// Releases `lease` on state `key` of `resource`, counted in flight if
/// `counted`: a caller that went away before it was told of its lease (see
/// `in_flight.rs`) has it released so, never counted.
pub(super) fn release(resource: Arc<Resource>, key: HeldKey, lease: LeaseId, counted: bool) {
    if let Some(keeper) = &resource.keeper {
        keeper.forget(lease);
    }
    if counted {
        drop_one(&resource.live.in_flight);
    }
    let key = match key {
        HeldKey::State(key) => key,
        HeldKey::Sub(sub) => {
            if let Some(local) = &resource.local {
                local.release(sub.as_deref(), lease);
            }
            return resource.slot_freed();
        }
    };
    let state = key.as_deref().unwrap_or(&resource.key);
    if let Some(result) = (resource.backend.local()).and_then(|l| l.release_now(state, lease)) {
        return released(&resource, result);
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let key = key.unwrap_or_else(|| resource.key.clone());
    // Pending on its key while on its way (see `pending.rs`).
    let pending = (resource.keeper.as_ref()).map(|k| k.on_its_way(key.clone(), lease));
    rt.spawn(async move {
        let result = match pending {
            Some(release) => release.await,
            None => resource.backend.release(&key, lease).await,
        };
        released(&resource, result);
    });
}

/// Logs a release's error; wakes the calls waiting for a slot.
fn released(resource: &Resource, result: Result<bool, BackendError>) {
    if let Err(e) = result {
        super::note_backend_error(resource, "release", &e);
    }
    resource.slot_freed();
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.release();
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permit_is_three_words_at_most() {
        assert!(std::mem::size_of::<Permit>() <= 3 * std::mem::size_of::<usize>());
        assert!(!Permit::empty().is_held());
    }
}
