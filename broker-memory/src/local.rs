//! [`ResourceStates`]: one resource's states, reached by sub-key without a
//! joined state key (the broker's fast path, see
//! [`broker_core::Backend::local_states`]), and its own state through a
//! pin, without the table (see [`crate::pinned`]).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use broker_core::state::LimitSpec;
use broker_core::{Cost, LeaseId, LocalStates, LocalVerdict};

use crate::key::KeyRef;
use crate::pinned::Pinned;
use crate::{lease_for, Store};

/// The states of one resource, for one registration's limits.
///
/// `repr(C, align(64))`, in this order: what a decision reads here (the
/// store, the pin in use, the limits, the resource's key) lies on one
/// cache line; in the compiler's order it spanned two.
#[repr(C, align(64))]
pub(crate) struct ResourceStates {
    store: Arc<Store>,
    /// The pin in use: the state of one of `own`'s pins, so valid for as
    /// long as `self` (a pin is set once and dropped with `self`); null
    /// before the first decision.
    current: AtomicPtr<Pinned>,
    spec: Arc<LimitSpec>,
    /// The resource's state key (its escaped id), shared by the keys of
    /// the states this handle creates.
    resource: Arc<str>,
    resource_hash: u64,
    /// The resource's own state, pinned by the first decision on it, and
    /// pinned again (up to [`PINS`] times in all) when a pin is found
    /// dead: a decision through another registration of the resource
    /// with a concurrency limit that came or went (made as the
    /// registrations changed) replaced the state and retired the pin.
    /// Earlier pins are kept, dead, until the registration is dropped.
    own: [OnceLock<Arc<Pinned>>; PINS],
    /// Held while pinning, so that a dead pin is replaced once.
    pinning: Mutex<()>,
}

/// How many times a registration pins its own state at most; past that,
/// it decides through the table.
const PINS: usize = 4;

impl ResourceStates {
    pub(crate) fn new(store: Arc<Store>, resource: &str, spec: Arc<LimitSpec>) -> Self {
        Self {
            store,
            resource: resource.into(),
            resource_hash: crate::key::resource_hash(resource),
            spec,
            own: Default::default(),
            current: AtomicPtr::new(std::ptr::null_mut()),
            pinning: Mutex::new(()),
        }
    }
}

impl ResourceStates {
    fn key<'a>(&'a self, sub: Option<&'a str>) -> KeyRef<'a> {
        KeyRef::local(&self.resource, self.resource_hash, sub)
    }

    /// The own state, pinned on first use and again when its pin is
    /// found dead; `None` once [`PINS`] pins have died (then the table
    /// decides).
    #[inline]
    fn own(&self) -> Option<&Pinned> {
        match self.current() {
            Some(own) if own.is_live() => Some(own),
            seen => self.pin(seen.map_or(std::ptr::null(), |own| own as *const Pinned)),
        }
    }

    /// The pin in use (dead or alive), if any.
    #[inline]
    fn current(&self) -> Option<&Pinned> {
        // SAFETY: `current` is null or the state of an `Arc` that `own`
        // holds until `self` is dropped (see the field).
        unsafe { self.current.load(Ordering::Acquire).as_ref() }
    }

    /// `try` on the own state through its pin; `None` when there is none
    /// (a dead pin) or the state is not one made for this registration's
    /// limits.
    #[inline]
    fn try_own(&self, cost: Cost) -> Option<LocalVerdict> {
        let spec = &self.spec;
        let own = self.own()?;
        let now = self.store.clock.now();
        let decided = own
            .state()
            .decide(spec, now, cost, lease_for(spec), || own.is_live())?;
        // A sweep is due on time too, and traffic on the own state alone
        // must keep idle sub-keys from piling up.
        self.store
            .sweeper
            .after_write(&self.store.states, &self.store.spills, now, false);
        Some(crate::unrounded(decided))
    }

    /// Pins the own state (made if need be, under the shard's write lock)
    /// when the pin in use is still `seen` (null: none yet, else a dead
    /// one), by one thread, in the next free place of `own`; the own state
    /// if live, else `None` (no place left, or retired again already).
    #[cold]
    #[inline(never)]
    fn pin(&self, seen: *const Pinned) -> Option<&Pinned> {
        if self.own[PINS - 1].get().is_some() {
            // Every place taken: the table decides, with no lock taken here.
            return self.current().filter(|own| own.is_live());
        }
        let _one = self.pinning.lock().unwrap_or_else(PoisonError::into_inner);
        if std::ptr::eq(self.current.load(Ordering::Acquire), seen) {
            let free = self.own.iter().find(|place| place.get().is_none())?;
            let spec = &self.spec;
            let pinned = self
                .store
                .pin(self.key(None), &self.resource, spec, || spec.clone());
            let pinned = free.get_or_init(|| pinned);
            self.current
                .store(Arc::as_ptr(pinned).cast_mut(), Ordering::Release);
        }
        self.current().filter(|own| own.is_live())
    }

    /// `try` on the state of `sub` (or on the own state) in the store's
    /// table. Out of line, apart from the own state's path: each keeps its
    /// registers (and its stack frame, a large one here) to itself.
    #[inline(never)]
    fn try_in_table(&self, sub: Option<&str>, cost: Cost) -> LocalVerdict {
        let spec = &self.spec;
        crate::unrounded(self.store.try_acquire(
            self.key(sub),
            Some(&self.resource),
            spec,
            || spec.clone(),
            cost,
        ))
    }
}

impl LocalStates for ResourceStates {
    fn try_acquire(&self, sub: Option<&str>, cost: Cost) -> LocalVerdict {
        if sub.is_none() {
            if let Some(decided) = self.try_own(cost) {
                return decided;
            }
        }
        self.try_in_table(sub, cost)
    }

    fn release(&self, sub: Option<&str>, lease: LeaseId) -> bool {
        if sub.is_none() {
            if let Some(released) = self.current().and_then(|own| own.release(lease)) {
                return released;
            }
        }
        self.store.release(self.key(sub), lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a decision reads of a resource's states lies on one cache
    /// line (see [`ResourceStates`]).
    #[test]
    fn a_decisions_fields_share_one_cache_line() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<ResourceStates>(), 64);
        let ends = [
            offset_of!(ResourceStates, store) + size_of::<Arc<Store>>(),
            offset_of!(ResourceStates, current) + size_of::<AtomicPtr<Pinned>>(),
            offset_of!(ResourceStates, spec) + size_of::<Arc<LimitSpec>>(),
            offset_of!(ResourceStates, resource) + size_of::<Arc<str>>(),
            offset_of!(ResourceStates, resource_hash) + size_of::<u64>(),
        ];
        assert!(ends.iter().all(|&end| end <= 64), "{ends:?}");
    }
}
