//! Releases sent from a task of their own, not yet answered: a decision on
//! the same key from this process sends them first, so a slot a permit
//! freed is free to the next caller here.
//!
//! A permit dropped with no synchronous release to make hands its release
//! to a spawned task. The next decision may go out before it, on another
//! connection or in a batch, and Redis would then still count the slot:
//! with a limit of 1, a client that sends its requests one after another
//! on a keep-alive connection was denied its second. `release` is
//! idempotent, so the slot may be released twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use broker_core::LeaseId;

/// The releases in flight, by state key.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// How many leases `by_key` holds: a decision finds none without the
    /// lock.
    count: AtomicUsize,
    by_key: Mutex<HashMap<String, Vec<LeaseId>>>,
}

impl Pending {
    /// A release of `lease` on `key` was handed to a task.
    pub(crate) fn add(&self, key: &str, lease: LeaseId) {
        let mut map = self.lock();
        map.entry(key.to_owned()).or_default().push(lease);
        self.count.fetch_add(1, Ordering::Release);
    }

    /// A release of `lease` on `key` was answered (or failed: the lease
    /// then expires after its TTL).
    pub(crate) fn remove(&self, key: &str, lease: LeaseId) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self.lock();
        let Some(leases) = map.get_mut(key) else {
            return;
        };
        if let Some(at) = leases.iter().position(|&l| l == lease) {
            leases.swap_remove(at);
            self.count.fetch_sub(1, Ordering::Release);
        }
        if leases.is_empty() {
            map.remove(key);
        }
    }

    /// The leases on `key` whose release is in flight (none, without a
    /// lock or an allocation, when no release is).
    pub(crate) fn on(&self, key: &str) -> Vec<LeaseId> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.lock().get(key).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<LeaseId>>> {
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_kept_by_key_until_answered() {
        let pending = Pending::default();
        assert!(pending.on("a").is_empty());
        pending.add("a", 1);
        pending.add("a", 2);
        pending.add("b", 3);
        assert_eq!(pending.on("a"), [1, 2]);
        assert_eq!(pending.on("b"), [3]);
        pending.remove("a", 1);
        pending.remove("a", 1);
        assert_eq!(pending.on("a"), [2]);
        pending.remove("a", 2);
        pending.remove("b", 3);
        assert!(pending.on("a").is_empty() && pending.on("b").is_empty());
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.lock().is_empty());
    }
}
