//! Releases not yet sent to a store with I/O: a dropped permit's, on its
//! way from a task, or kept while the store was out of reach. A decision
//! that can take a slot on a key sends that key's first, within its own
//! bound ([`crate::store::begun`]), so it never overtakes a release made
//! before it (which would count a freed slot as taken); kept ones are sent
//! again once the store reads up.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use super::Resource;
use crate::error::BackendError;
use crate::state::{LeaseId, LimitSpec};
use crate::store::Store;

/// Most releases pending; past it, one that cannot reach the store is left
/// to its lease's TTL.
const MAX_KEPT: usize = 100_000;

/// How often the kept releases are sent again while the store reads up.
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// The releases not yet sent, by state key.
pub(crate) struct Pending {
    store: Arc<dyn Store>,
    /// How many releases `by_key` holds: a decision finds none without the
    /// lock.
    count: AtomicUsize,
    /// Whether the task that sends the kept ones runs.
    retrying: AtomicBool,
    by_key: Mutex<HashMap<String, Vec<Release>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Release {
    lease: LeaseId,
    /// Kept after the store could not be reached: no task sends it.
    kept: bool,
}

/// `decision`, which may take a slot on state `key` of `resource` under
/// `spec`, after the releases pending on `key`; both within one bound.
pub(crate) async fn in_order<T>(
    resource: &Resource,
    key: &str,
    spec: &LimitSpec,
    decision: impl Future<Output = T>,
) -> T {
    let pending = (resource.keeper.as_ref()).map(|k| &k.pending);
    match pending.filter(|p| spec.max_concurrent.is_some() && p.any()) {
        None => decision.await,
        Some(p) => {
            let ahead = async {
                let mut taken = Taken(p, p.take(Some(key), |_| true));
                while let Some((key, lease)) = taken.1.last() {
                    let _ = p.send(key, *lease).await;
                    taken.1.pop();
                }
                decision.await
            };
            let now = tokio::time::Instant::now();
            crate::store::BEGUN.scope(now, ahead).await
        }
    }
}

impl Pending {
    pub(crate) fn new(store: Arc<dyn Store>) -> Arc<Self> {
        let (count, retrying) = (AtomicUsize::new(0), AtomicBool::new(false));
        let by_key = Mutex::default();
        Arc::new(Self {
            store,
            count,
            retrying,
            by_key,
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Release>>> {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// Whether `release` is pending on `key`.
    fn holds(&self, key: &str, release: Release) -> bool {
        self.any() && self.lock().get(key).is_some_and(|r| r.contains(&release))
    }

    /// The release of `lease` on `key`, to be sent from a task: pending
    /// until sent, or until the returned guard is dropped unsent.
    pub(crate) fn on_its_way(self: &Arc<Self>, key: String, lease: LeaseId) -> OnItsWay {
        let release = Release { lease, kept: false };
        self.lock().entry(key.clone()).or_default().push(release);
        self.count.fetch_add(1, Ordering::Release);
        let pending = self.clone();
        OnItsWay {
            pending,
            key,
            lease,
        }
    }

    /// Takes out `release` of `key`: whether it was there.
    fn remove(&self, key: &str, release: Release) -> bool {
        !self.take(Some(key), |r| *r == release).is_empty()
    }

    /// Takes out the releases `take` accepts, of `key` or (`None`) all.
    fn take(&self, key: Option<&str>, take: impl Fn(&Release) -> bool) -> Vec<(String, LeaseId)> {
        if !self.any() {
            return Vec::new();
        }
        let (mut map, mut taken) = (self.lock(), Vec::new());
        let mut out = |key: &str, releases: &mut Vec<Release>| {
            releases.retain(|r| {
                !(take(r) && {
                    taken.push((key.to_owned(), r.lease));
                    true
                })
            });
            !releases.is_empty()
        };
        match key {
            None => map.retain(|k, releases| out(k, releases)),
            Some(k) if map.get_mut(k).is_some_and(|r| !out(k, r)) => drop(map.remove(k)),
            Some(_) => {}
        }
        self.count.fetch_sub(taken.len(), Ordering::Release);
        taken
    }

    fn holds_kept(&self) -> bool {
        self.any() && self.lock().values().flatten().any(|r| r.kept)
    }

    /// Keeps the release of `lease` on `key`, which could not reach the
    /// store, for the next decision on `key` or the retrying task.
    fn keep(self: &Arc<Self>, key: &str, lease: LeaseId) {
        let mut map = self.lock();
        let releases = map.entry(key.to_owned()).or_default();
        match releases.iter_mut().find(|r| r.lease == lease) {
            Some(r) => r.kept = true,
            None if self.count.load(Ordering::Relaxed) < MAX_KEPT => {
                releases.push(Release { lease, kept: true });
                self.count.fetch_add(1, Ordering::Release);
            }
            None => {
                if releases.is_empty() {
                    map.remove(key);
                }
                return tracing::debug!("too many releases kept while the store is out of reach; this one is left to its lease's ttl");
            }
        }
        drop(map);
        self.retry();
    }

    /// Starts the task that sends the kept releases, unless it runs.
    fn retry(self: &Arc<Self>) {
        if !self.retrying.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(retry_kept(Retrying(Arc::downgrade(self))))),
                Err(_) => self.retrying.store(false, Ordering::Release),
            }
        }
    }

    /// [`Store::release`], kept if the store is out of reach.
    async fn send(self: &Arc<Self>, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        let released = self.store.release(key, lease).await;
        if released.as_ref().is_err_and(BackendError::is_unavailable) {
            self.keep(key, lease);
        }
        released
    }
}

/// Releases a decision took to send ahead of itself: those it left unsent
/// (its caller went away) are kept.
struct Taken<'a>(&'a Arc<Pending>, Vec<(String, LeaseId)>);

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        for (key, lease) in self.1.drain(..) {
            self.0.keep(&key, lease);
        }
    }
}

/// A release sent from a task, pending while on its way; dropped unsent
/// (its task dropped with its runtime), it leaves nothing pending.
pub(crate) struct OnItsWay {
    pending: Arc<Pending>,
    key: String,
    lease: LeaseId,
}

impl OnItsWay {
    /// Sends the release, unless a decision did; it stays pending while
    /// on its way, so a decision meanwhile sends it ahead of itself too.
    pub(crate) async fn send(self) -> Result<bool, BackendError> {
        let own = Release {
            lease: self.lease,
            kept: false,
        };
        match self.pending.holds(&self.key, own) {
            true => self.pending.send(&self.key, self.lease).await,
            false => Ok(true),
        }
    }
}

impl Drop for OnItsWay {
    fn drop(&mut self) {
        let own = Release {
            lease: self.lease,
            kept: false,
        };
        self.pending.remove(&self.key, own);
    }
}

/// Sends the kept releases once the store reads up, every
/// [`RETRY_EVERY`], until none is kept.
async fn retry_kept(running: Retrying) {
    loop {
        tokio::time::sleep(RETRY_EVERY).await;
        let Some(pending) = running.0.upgrade() else {
            return;
        };
        if !pending.store.health().down {
            for (key, lease) in pending.take(None, |r| r.kept) {
                // Kept again if the store cannot be reached.
                let _ = pending.send(&key, lease).await;
            }
        }
        if !pending.holds_kept() {
            drop(running);
            // Kept meanwhile, when `keep` found this task still running.
            if pending.holds_kept() {
                pending.retry();
            }
            return;
        }
    }
}

/// The retrying task while it runs: dropped, it lets the next kept release
/// start one again.
struct Retrying(Weak<Pending>);

impl Drop for Retrying {
    fn drop(&mut self) {
        if let Some(pending) = self.0.upgrade() {
            pending.retrying.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::tests::NoStore;

    fn held(pending: &Pending, key: &str, lease: LeaseId) -> bool {
        let own = Release { lease, kept: false };
        pending.lock().get(key).is_some_and(|r| r.contains(&own))
    }

    fn taken(pending: &Pending, key: &str) -> Vec<LeaseId> {
        let taken = pending.take(Some(key), |_| true);
        taken.into_iter().map(|(_, lease)| lease).collect()
    }

    #[test]
    fn leases_are_kept_by_key_until_answered_or_taken() {
        let pending = Pending::new(Arc::new(NoStore));
        assert!(taken(&pending, "a").is_empty());
        let ways = [("a", 1), ("a", 2), ("b", 3)].map(|(k, l)| pending.on_its_way(k.into(), l));
        assert!(held(&pending, "a", 1));
        let own = |lease| Release { lease, kept: false };
        assert!(pending.remove("a", own(1)));
        assert!(!pending.remove("a", own(1)));
        assert!(!held(&pending, "a", 1));
        assert_eq!(taken(&pending, "a"), [2]);
        assert!(taken(&pending, "a").is_empty(), "taken once");
        assert!(!pending.remove("a", own(2)), "a decision sent it");
        assert_eq!(taken(&pending, "b"), [3]);
        assert!(!pending.remove("b", own(3)));
        drop(ways);
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.lock().is_empty());
    }

    /// A kept release is no task's: its task's end leaves it, and it is
    /// taken by a decision on its key or by the retrying task, once.
    #[test]
    fn kept_releases_stay_until_a_decision_or_the_retry_takes_them() {
        let pending = Pending::new(Arc::new(NoStore));
        let a = pending.on_its_way("a".into(), 1);
        pending.keep("a", 1);
        assert!(!held(&pending, "a", 1), "no longer its task's");
        drop(a);
        let own = Release {
            lease: 1,
            kept: false,
        };
        assert!(!pending.remove("a", own), "its task's end leaves it");
        pending.keep("b", 2);
        let c = pending.on_its_way("c".into(), 3);
        assert!(pending.holds_kept());
        assert_eq!(taken(&pending, "b"), [2]);
        assert_eq!(pending.take(None, |r| r.kept), [("a".to_owned(), 1)]);
        assert!(!pending.holds_kept());
        assert!(held(&pending, "c", 3), "a task's own stays");
        drop(c);
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
    }

    /// Release tasks dropped unrun with their runtime leave nothing
    /// pending.
    #[test]
    fn a_release_whose_task_never_ran_does_not_stay_pending() {
        let pending = Pending::new(Arc::new(NoStore));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in 0..100 {
                let release = pending.on_its_way(format!("t{i}"), i);
                tokio::spawn(async move { release.send().await });
            }
        });
        assert_eq!(pending.count.load(Ordering::Relaxed), 100);
        drop(rt);
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.lock().is_empty());
    }
}
