//! Releases not yet sent: handed to a task, or kept while Redis was out of
//! reach. A decision on the same key takes them out and sends them first,
//! so it never overtakes a release made before it (which would count a
//! freed slot as taken); the background probe sends the kept ones once
//! Redis answers again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use broker_core::LeaseId;

/// Most releases kept while Redis is out of reach; past it, the next ones
/// are left to their leases' TTL.
const MAX_KEPT: usize = 100_000;

/// The releases not yet sent, by state key.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// How many leases `by_key` holds: a decision finds none without the
    /// lock.
    count: AtomicUsize,
    /// How many of them are kept.
    kept: AtomicUsize,
    by_key: Mutex<HashMap<String, Vec<Release>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Release {
    lease: LeaseId,
    /// Kept after Redis could not be reached: no task sends it.
    kept: bool,
}

impl Pending {
    /// A release of `lease` on `key` was handed to a task.
    pub(crate) fn add(&self, key: &str, lease: LeaseId) {
        let release = Release { lease, kept: false };
        self.lock().entry(key.to_owned()).or_default().push(release);
        self.count.fetch_add(1, Ordering::Release);
    }

    /// Keeps the release of `lease` on `key`, which could not reach Redis;
    /// false when [`MAX_KEPT`] are kept already.
    pub(crate) fn keep(&self, key: &str, lease: LeaseId) -> bool {
        let mut map = self.lock();
        let leases = map.entry(key.to_owned()).or_default();
        if let Some(r) = leases.iter_mut().find(|r| r.lease == lease) {
            if !r.kept {
                r.kept = true;
                self.kept.fetch_add(1, Ordering::Relaxed);
            }
            return true;
        }
        if self.kept.load(Ordering::Relaxed) >= MAX_KEPT {
            if leases.is_empty() {
                map.remove(key);
            }
            return false;
        }
        leases.push(Release { lease, kept: true });
        self.kept.fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Release);
        true
    }

    pub(crate) fn any_kept(&self) -> bool {
        self.kept.load(Ordering::Relaxed) != 0
    }

    /// Takes out the kept releases of the keys `send_now` accepts.
    pub(crate) fn take_kept(&self, send_now: impl Fn(&str) -> bool) -> Vec<(String, LeaseId)> {
        if !self.any_kept() {
            return Vec::new();
        }
        let mut taken = Vec::new();
        self.lock().retain(|key, leases| {
            if send_now(key) {
                leases.retain(|r| {
                    if r.kept {
                        taken.push((key.clone(), r.lease));
                    }
                    !r.kept
                });
            }
            !leases.is_empty()
        });
        self.kept.fetch_sub(taken.len(), Ordering::Relaxed);
        self.count.fetch_sub(taken.len(), Ordering::Release);
        taken
    }

    /// Takes out the release of `lease` on `key` that its task was handed:
    /// whether it was still here (not taken by a decision, nor kept).
    pub(crate) fn remove(&self, key: &str, lease: LeaseId) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut map = self.lock();
        let Some(leases) = map.get_mut(key) else {
            return false;
        };
        let at = leases.iter().position(|r| r.lease == lease && !r.kept);
        if let Some(at) = at {
            leases.swap_remove(at);
            self.count.fetch_sub(1, Ordering::Release);
        }
        if leases.is_empty() {
            map.remove(key);
        }
        at.is_some()
    }

    /// Whether the release of `lease` on `key` is still its task's to send.
    pub(crate) fn contains(&self, key: &str, lease: LeaseId) -> bool {
        self.count.load(Ordering::Acquire) != 0
            && self
                .lock()
                .get(key)
                .is_some_and(|l| l.contains(&Release { lease, kept: false }))
    }

    /// Takes out the leases on `key` whose release is not yet sent, for the
    /// caller to send.
    pub(crate) fn take(&self, key: &str) -> Vec<LeaseId> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let taken = self.lock().remove(key).unwrap_or_default();
        let kept = taken.iter().filter(|r| r.kept).count();
        self.kept.fetch_sub(kept, Ordering::Relaxed);
        self.count.fetch_sub(taken.len(), Ordering::Release);
        taken.into_iter().map(|r| r.lease).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Release>>> {
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

    /// A kept release is no task's: its task's end leaves it, and it is
    /// taken by a decision on its key or by the probe, once.
    #[test]
    fn kept_releases_stay_until_a_decision_or_the_probe_takes_them() {
        let pending = Pending::default();
        pending.add("a", 1);
        assert!(pending.keep("a", 1), "its task could not send it");
        assert!(!pending.contains("a", 1), "no longer its task's");
        assert!(!pending.remove("a", 1), "its task's end leaves it");
        assert!(pending.keep("b", 2));
        pending.add("c", 3);
        assert!(pending.any_kept());
        assert_eq!(pending.take("b"), [2]);
        assert_eq!(pending.take_kept(|_| true), [("a".to_owned(), 1)]);
        assert!(!pending.any_kept());
        assert!(pending.contains("c", 3), "a task's own stays");
        assert!(pending.remove("c", 3));
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
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
