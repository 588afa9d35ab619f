//! The answer of `try_acquire` / `acquire`, and the [`Permit`] that holds a
//! concurrency slot until it is released or dropped.

use std::sync::Arc;
use std::time::Duration;

use super::Resource;
use crate::backend::Backend;
use crate::state::{DenyReason, LeaseId};
use crate::stats::{bump, drop_one};

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
}

/// A held concurrency slot. [`Permit::release`] is idempotent, and dropping
/// the permit releases it. Permits of resources without a concurrency limit
/// and of denied acquisitions hold nothing.
#[derive(Debug, Default)]
#[must_use = "dropping a permit releases it at once"]
pub struct Permit {
    held: Slot,
}

/// What a [`Permit`] holds. Three words at most, so the `Acquisition`
/// stays within the size of the error it is returned beside.
#[derive(Debug, Default)]
enum Slot {
    /// Nothing (no concurrency limit, or denied).
    #[default]
    Empty,
    /// A lease on the resource's own state in a store that answers in
    /// process (see [`crate::Backend::local_states`]), counted in flight:
    /// the common held slot, made and released without an allocation.
    Own(Arc<Resource>, LeaseId),
    /// Any other lease.
    Held(Box<Held>),
}

#[derive(Debug)]
struct Held {
    backend: Arc<dyn Backend>,
    resource: Arc<Resource>,
    key: HeldKey,
    lease: LeaseId,
    counted: bool,
}

/// The state a lease is held on.
#[derive(Debug)]
pub(crate) enum HeldKey {
    /// The resource's own state, or sub-key `k` (as the caller gave it).
    Sub(Option<Box<str>>),
    /// A state key built by [`crate::keys`] (`None`: the resource's own).
    State(Option<String>),
}

impl HeldKey {
    pub(crate) fn sub(key: Option<&str>) -> Self {
        Self::Sub(key.map(Box::from))
    }
}

impl std::fmt::Debug for dyn Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Backend")
    }
}

impl Permit {
    /// A permit that holds nothing.
    pub const fn empty() -> Self {
        Self { held: Slot::Empty }
    }

    /// A counted lease on the own state of `resource`, which must answer
    /// in process (`resource.local` is set).
    pub(crate) fn own(resource: Arc<Resource>, lease: LeaseId) -> Self {
        bump(&resource.counters.in_flight);
        Self {
            held: Slot::Own(resource, lease),
        }
    }

    pub(crate) fn held(
        backend: Arc<dyn Backend>,
        resource: Arc<Resource>,
        key: HeldKey,
        lease: LeaseId,
        counted: bool,
    ) -> Self {
        if counted {
            bump(&resource.counters.in_flight);
        }
        Self {
            held: Slot::Held(Box::new(Held {
                backend,
                resource,
                key,
                lease,
                counted,
            })),
        }
    }

    /// Whether this permit holds a slot.
    pub fn is_held(&self) -> bool {
        !matches!(self.held, Slot::Empty)
    }

    /// Releases the slot. Idempotent; a no-op on an empty permit.
    ///
    /// On an in-memory backend this is immediate. On a remote backend the
    /// release is sent on the current tokio runtime; without one, the lease
    /// expires after the resource's `lease_ttl`.
    #[inline]
    pub fn release(&mut self) {
        // The empty permit (no concurrency limit, or denied) is the common
        // case: one check, inlined where the permit is dropped.
        if !matches!(self.held, Slot::Empty) {
            release_slot(std::mem::take(&mut self.held));
        }
    }
}

#[inline(never)]
fn release_slot(slot: Slot) {
    match slot {
        Slot::Empty => {}
        Slot::Own(resource, lease) => release_own(&resource, lease),
        Slot::Held(h) => release_held(*h),
    }
}

#[inline]
fn release_own(resource: &Resource, lease: LeaseId) {
    drop_one(&resource.counters.in_flight);
    if let Some(local) = &resource.local {
        local.release(None, lease);
    }
    resource.slot_freed();
}

fn release_held(h: Held) {
    if h.counted {
        drop_one(&h.resource.counters.in_flight);
    }
    let resource = &h.resource;
    if let (Some(local), HeldKey::Sub(sub)) = (&resource.local, &h.key) {
        local.release(sub.as_deref(), h.lease);
        resource.slot_freed();
        return;
    }
    let key = match h.key {
        HeldKey::Sub(sub) => sub.map(|k| crate::keys::keyed(&resource.id, &k)),
        HeldKey::State(key) => key,
    };
    match h
        .backend
        .release_now(key.as_deref().unwrap_or(&resource.key), h.lease)
    {
        Some(result) => {
            if let Err(e) = result {
                super::note_backend_error(resource, "release", &e);
            }
            resource.slot_freed();
        }
        None => {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let key = key.unwrap_or_else(|| h.resource.key.clone());
                let (backend, resource) = (h.backend, h.resource);
                rt.spawn(async move {
                    if let Err(e) = backend.release(&key, h.lease).await {
                        super::note_backend_error(&resource, "release", &e);
                    }
                    resource.slot_freed();
                });
            }
        }
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permit_is_at_most_three_words_and_the_answer_no_larger_than_its_error() {
        assert!(std::mem::size_of::<Permit>() <= 3 * std::mem::size_of::<usize>());
        assert!(
            std::mem::size_of::<Result<Acquisition, crate::BrokerError>>()
                <= std::mem::size_of::<crate::BrokerError>() + std::mem::size_of::<usize>()
        );
        assert!(!Permit::empty().is_held());
    }
}
