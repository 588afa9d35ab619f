//! [`ResourceStates`]: one resource's states, reached by sub-key
//! ([`broker_core::LocalStore::states`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use broker_core::state::{self, LimitSpec, Verdict};
use broker_core::{Cost, LeaseId, LocalStates};

use crate::key::KeyRef;
use crate::store::{self, Store};

/// The states of one resource, for one registration's limits.
pub(crate) struct ResourceStates {
    store: Arc<Store>,
    spec: Arc<LimitSpec>,
    /// The resource's state key, shared by the keys of the states it makes.
    resource: Arc<str>,
    /// Whether this registration decided on the resource's own state (which
    /// the store then keeps until it is dropped).
    decides_on_own: AtomicBool,
}

impl ResourceStates {
    pub(crate) fn new(store: Arc<Store>, resource: &str, spec: Arc<LimitSpec>) -> Self {
        Self {
            store,
            resource: resource.into(),
            spec,
            decides_on_own: AtomicBool::new(false),
        }
    }

    fn key<'a>(&'a self, sub: Option<&'a str>) -> KeyRef<'a> {
        KeyRef::local(&self.resource, sub)
    }
}

impl LocalStates for ResourceStates {
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Verdict {
        if sub.is_none()
            && !self.decides_on_own.load(Ordering::Relaxed)
            && !self.decides_on_own.swap(true, Ordering::AcqRel)
        {
            self.store.register_own(&self.resource);
        }
        let spec = &self.spec;
        let lease = store::lease_for(spec);
        let decided = self.store.with_state(
            self.key(sub),
            Some(&self.resource),
            spec,
            || spec.clone(),
            |s, now| state::try_acquire(s, spec, now, cost, lease),
        );
        Verdict::from(decided)
    }

    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool {
        self.store.release(self.key(sub), lease)
    }
}

impl Drop for ResourceStates {
    fn drop(&mut self) {
        if *self.decides_on_own.get_mut() {
            self.store.unregister_own(&self.resource);
        }
    }
}
