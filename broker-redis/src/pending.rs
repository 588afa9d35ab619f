//! Releases handed to a task of their own, not yet sent: a decision on the
//! same key from this process takes them out and sends them first, so a
//! slot a permit freed is free to the next caller here.
//!
//! A permit dropped with no synchronous release to make hands its release
//! to a spawned task. The next decision may go out before it, on another
//! connection or in a batch, and Redis would then still count the slot:
//! with a limit of 1, a client that sends its requests one after another
//! on a keep-alive connection was denied its second. A release stays here
//! until its task's send is answered, so a decision meanwhile still finds
//! it; a decision takes it out, so it is sent by one decision at most, and
//! by its task only if no decision took it first.

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

    /// Takes out the release of `lease` on `key` (its task sent it, or will
    /// not run): whether it was still here, not taken out by a decision.
    pub(crate) fn remove(&self, key: &str, lease: LeaseId) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut map = self.lock();
        let Some(leases) = map.get_mut(key) else {
            return false;
        };
        let found = match leases.iter().position(|&l| l == lease) {
            Some(at) => {
                leases.swap_remove(at);
                self.count.fetch_sub(1, Ordering::Release);
                true
            }
            None => false,
        };
        if leases.is_empty() {
            map.remove(key);
        }
        found
    }

    /// Whether the release of `lease` on `key` is still here: not taken out
    /// by a decision, which sent it.
    pub(crate) fn contains(&self, key: &str, lease: LeaseId) -> bool {
        self.count.load(Ordering::Acquire) != 0
            && self.lock().get(key).is_some_and(|l| l.contains(&lease))
    }

    /// Takes out the leases on `key` whose release is in flight, for the
    /// caller to send (none, without a lock or an allocation, when no
    /// release is): each is sent by at most one decision, besides its own
    /// task.
    pub(crate) fn take(&self, key: &str) -> Vec<LeaseId> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let taken = self.lock().remove(key).unwrap_or_default();
        self.count.fetch_sub(taken.len(), Ordering::Release);
        taken
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<LeaseId>>> {
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_kept_by_key_until_answered_or_taken() {
        let pending = Pending::default();
        assert!(pending.take("a").is_empty());
        pending.add("a", 1);
        pending.add("a", 2);
        pending.add("b", 3);
        assert!(pending.contains("a", 1));
        assert!(pending.remove("a", 1));
        assert!(!pending.remove("a", 1));
        assert!(!pending.contains("a", 1));
        assert_eq!(pending.take("a"), [2]);
        assert!(pending.take("a").is_empty(), "taken once");
        assert!(!pending.remove("a", 2), "a decision sent it");
        assert_eq!(pending.take("b"), [3]);
        assert!(!pending.remove("b", 3));
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.lock().is_empty());
    }

    /// Permits dropped as their runtime ends: their release tasks are
    /// dropped unrun, and tell the store so; nothing stays pending.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_whose_task_never_ran_does_not_stay_pending() {
        use broker_core::{Cost, Limits, ResourceBroker};
        let server = broker_testkit::RedisServer::start();
        let backend = crate::RedisBackend::connect(&server.url()).await.unwrap();
        let broker = ResourceBroker::new(backend.clone());
        broker
            .register_limit("tenants", Limits::new().max_concurrent(1))
            .unwrap();
        let b = broker.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut permits = Vec::new();
                for i in 0..100 {
                    let t = format!("t{i}");
                    let a = b
                        .try_acquire(("tenants", t.as_str()), Cost::default())
                        .await
                        .unwrap();
                    assert!(a.allowed);
                    permits.push(a);
                }
                // Their release tasks are spawned, and dropped unrun with
                // the runtime.
                drop(permits);
            });
        })
        .join()
        .unwrap();
        let pending = &backend.inner.pending;
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.lock().is_empty());
    }
}
