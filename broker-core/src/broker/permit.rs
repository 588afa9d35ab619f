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
    /// Boxed so that an empty permit (the common case: no concurrency
    /// limit, or denied) is one pointer wide and the `Acquisition` small.
    held: Option<Box<Held>>,
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
        Self { held: None }
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
            held: Some(Box::new(Held {
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
        self.held.is_some()
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
        if let Some(h) = self.held.take() {
            release_held(*h);
        }
    }
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
    fn empty_permit_is_one_pointer_wide() {
        assert_eq!(std::mem::size_of::<Permit>(), std::mem::size_of::<usize>());
        assert!(!Permit::empty().is_held());
    }
}
