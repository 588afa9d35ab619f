//! [`ResourceStates`]: one resource's states, reached by sub-key without a
//! joined state key (the broker's fast path, see
//! [`broker_core::Backend::local_states`]).

use std::sync::Arc;

use broker_core::state::LimitSpec;
use broker_core::{Cost, LeaseId, LocalStates, Verdict};

use crate::key::KeyRef;
use crate::Store;

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
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Verdict {
        let spec = &self.spec;
        crate::rounded(self.store.try_acquire(
            self.key(sub),
            Some(&self.resource),
            spec,
            || spec.clone(),
            cost,
        ))
    }

    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool {
        self.store.release(self.key(sub), lease)
    }
}
