//! [`ResourceStates`]: one resource's states, reached by sub-key without a
//! joined state key (the broker's fast path, see
//! [`broker_core::Backend::local_states`]), and its own state through a
//! pin, without the table (see [`crate::pinned`]).

use std::sync::{Arc, OnceLock};

use broker_core::state::LimitSpec;
use broker_core::{Cost, LeaseId, LocalStates, Verdict};

use crate::key::KeyRef;
use crate::pinned::Pinned;
use crate::{lease_for, Store};

/// The states of one resource, for one registration's limits.
pub(crate) struct ResourceStates {
    store: Arc<Store>,
    /// The resource's state key (its escaped id), shared by the keys of
    /// the states this handle creates.
    resource: Arc<str>,
    resource_hash: u64,
    spec: Arc<LimitSpec>,
    /// The resource's own state, pinned by the first decision on it.
    own: OnceLock<Arc<Pinned>>,
}

impl ResourceStates {
    pub(crate) fn new(store: Arc<Store>, resource: &str, spec: Arc<LimitSpec>) -> Self {
        Self {
            store,
            resource: resource.into(),
            resource_hash: crate::key::resource_hash(resource),
            spec,
            own: OnceLock::new(),
        }
    }
}

impl ResourceStates {
    fn key<'a>(&'a self, sub: Option<&'a str>) -> KeyRef<'a> {
        KeyRef::local(&self.resource, self.resource_hash, sub)
    }

    /// The own state, pinned on first use; `None` once the table holds
    /// another state for it (a re-configuration replaced it, and retired
    /// the pinned one).
    #[inline]
    fn own(&self) -> Option<&Pinned> {
        let own = match self.own.get() {
            Some(own) => own,
            None => self.pin(),
        };
        Some(&**own).filter(|own| own.is_live())
    }

    /// `try` on the own state through its pin; `None` when there is none
    /// (a dead pin) or the state is not one made for this registration's
    /// limits. Apart from the sub-keys' path, so that path keeps its
    /// registers to itself.
    #[inline(never)]
    fn try_own(&self, cost: Cost) -> Option<Verdict> {
        let spec = &self.spec;
        let own = self.own()?;
        let now = self.store.clock.now();
        let decided = own
            .state()
            .decide(spec, now, cost, lease_for(spec), || own.is_live())?;
        Some(crate::rounded(decided))
    }

    /// Pins the own state (made if need be, under the shard's write lock)
    /// on the first decision on it.
    #[cold]
    #[inline(never)]
    fn pin(&self) -> &Arc<Pinned> {
        let spec = &self.spec;
        let pinned = self
            .store
            .pin(self.key(None), &self.resource, spec, || spec.clone());
        // Another thread may have pinned first: the same state.
        self.own.get_or_init(|| pinned)
    }
}

impl LocalStates for ResourceStates {
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> Verdict {
        if sub.is_none() {
            if let Some(decided) = self.try_own(cost) {
                return decided;
            }
        }
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
        if sub.is_none() {
            if let Some(released) = self.own.get().and_then(|own| own.release(lease)) {
                return released;
            }
        }
        self.store.release(self.key(sub), lease)
    }
}
