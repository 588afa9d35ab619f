//! [`ResourceStates`]: one resource's states, reached by sub-key without a
//! joined state key (the broker's fast path, see
//! [`broker_core::Backend::local_states`]).

use std::sync::Arc;

use broker_core::state::{self, LimitSpec};
use broker_core::{Cost, Decision, LeaseId, LocalStates};

use crate::key::KeyRef;
use crate::{Store, Stored};

/// The states of one resource, for one registration's limits.
pub(crate) struct ResourceStates {
    store: Arc<Store>,
    /// The resource's state key (its escaped id), shared by the keys of
    /// the states this handle creates.
    resource: Arc<str>,
    resource_hash: u64,
    spec: Arc<LimitSpec>,
}

impl ResourceStates {
    pub(crate) fn new(store: Arc<Store>, resource: &str, spec: Arc<LimitSpec>) -> Self {
        Self {
            store,
            resource: resource.into(),
            resource_hash: crate::key::resource_hash(resource),
            spec,
        }
    }
}

impl ResourceStates {
    fn key<'a>(&'a self, sub: Option<&'a str>) -> KeyRef<'a> {
        KeyRef::local(&self.resource, self.resource_hash, sub)
    }
}

impl LocalStates for ResourceStates {
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Decision {
        let spec = &self.spec;
        let lease = if spec.max_concurrent.is_some() {
            self.store.lease()
        } else {
            0
        };
        self.store.with_state(
            self.key(sub),
            Some(&self.resource),
            spec,
            || spec.clone(),
            |s, now| match (s, spec.buckets.as_slice()) {
                (Stored::One(b), [(unit, p)]) => state::try_acquire_one(b, *unit, p, now, cost),
                (s, _) => s.with_full(|s| state::try_acquire(s, spec, now, cost, lease)),
            },
        )
    }

    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool {
        self.store.release(self.key(sub), lease)
    }
}
