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
    let Some(p) = pending.filter(|p| spec.max_concurrent.is_some() && p.any()) else {
        return decision.await;
    };
    let ahead = async {
        // Those left unsent if the caller goes away stay pending.
        for (key, lease) in p.list(Some(key), |_| true) {
            let _ = p.send(&key, lease).await;
        }
        decision.await
    };
    crate::store::BEGUN
        .scope(tokio::time::Instant::now(), ahead)
        .await
}

impl Pending {
    pub(crate) fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            store,
            count: AtomicUsize::new(0),
            retrying: AtomicBool::new(false),
            by_key: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Release>>> {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// The releases pending on `key` (`None`: on any) that `which`
    /// accepts.
    fn list(&self, key: Option<&str>, which: impl Fn(&Release) -> bool) -> Vec<(String, LeaseId)> {
        if !self.any() {
            return Vec::new();
        }
        let (map, mut out) = (self.lock(), Vec::new());
        let mut add = |k: &String, releases: &Vec<Release>| {
            let of = releases.iter().filter(|r| which(r));
            out.extend(of.map(|r| (k.clone(), r.lease)));
        };
        match key.map(|key| map.get_key_value(key)) {
            Some(on) => on.into_iter().for_each(|(k, r)| add(k, r)),
            None => map.iter().for_each(|(k, r)| add(k, r)),
        }
        out
    }

    /// The release of `lease` on `key`, to be sent from a task: pending
    /// until sent, or until the returned guard is dropped unsent.
    pub(crate) fn on_its_way(self: &Arc<Self>, key: String, lease: LeaseId) -> OnItsWay {
        let own = Release { lease, kept: false };
        self.lock().entry(key.clone()).or_default().push(own);
        self.count.fetch_add(1, Ordering::Release);
        let pending = self.clone();
        OnItsWay { pending, key, own }
    }

    /// Takes out the releases on `key` that `which` accepts: whether any.
    fn remove(&self, key: &str, which: impl Fn(&Release) -> bool) -> bool {
        if !self.any() {
            return false;
        }
        let mut map = self.lock();
        let Some(releases) = map.get_mut(key) else {
            return false;
        };
        let before = releases.len();
        releases.retain(|r| !which(r));
        let gone = before - releases.len();
        if releases.is_empty() {
            map.remove(key);
        }
        self.count.fetch_sub(gone, Ordering::Release);
        gone != 0
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

    /// [`Store::release`]: taken out once answered, kept if the store is
    /// out of reach.
    async fn send(self: &Arc<Self>, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        let released = self.store.release(key, lease).await;
        match released.as_ref().is_err_and(BackendError::is_unavailable) {
            true => self.keep(key, lease),
            false => drop(self.remove(key, |r| r.lease == lease)),
        }
        released
    }
}

/// A release sent from a task, pending while on its way; dropped unsent
/// (its task dropped with its runtime), it leaves nothing pending.
pub(crate) struct OnItsWay {
    pending: Arc<Pending>,
    key: String,
    own: Release,
}

impl OnItsWay {
    /// Sends the release, unless a decision did (or it was kept); while on
    /// its way, a decision sends it ahead of itself too.
    pub(crate) async fn send(self) -> Result<bool, BackendError> {
        let (pending, key) = (&self.pending, self.key.as_str());
        match pending.list(Some(key), |r| *r == self.own).is_empty() {
            true => Ok(true),
            false => pending.send(key, self.own.lease).await,
        }
    }
}

impl Drop for OnItsWay {
    fn drop(&mut self) {
        self.pending.remove(&self.key, |r| *r == self.own);
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
        let kept = |r: &Release| r.kept;
        if !pending.store.health().down {
            for (key, lease) in pending.list(None, kept) {
                let _ = pending.send(&key, lease).await;
            }
        }
        if pending.list(None, kept).is_empty() {
            drop(running);
            // Kept meanwhile, when `keep` found this task still running.
            if !pending.list(None, kept).is_empty() {
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

    fn on(pending: &Pending, key: &str, kept: bool) -> Vec<LeaseId> {
        let list = pending.list(Some(key), |r| r.kept == kept);
        list.into_iter().map(|(_, lease)| lease).collect()
    }

    #[test]
    fn leases_are_kept_by_key_until_answered_or_taken() {
        let pending = Pending::new(Arc::new(NoStore));
        assert!(on(&pending, "a", false).is_empty());
        let ways = [("a", 1), ("a", 2), ("b", 3)].map(|(k, l)| pending.on_its_way(k.into(), l));
        assert_eq!(on(&pending, "a", false), [1, 2]);
        let own = |lease| move |r: &Release| *r == Release { lease, kept: false };
        assert!(pending.remove("a", own(1)));
        assert!(!pending.remove("a", own(1)));
        assert_eq!(on(&pending, "a", false), [2]);
        assert!(pending.remove("a", |_| true), "a decision sent it");
        assert!(!pending.remove("a", own(2)));
        drop(ways);
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.lock().is_empty());
    }

    /// A kept release is no task's: its task's end leaves it, and it stays
    /// until a decision or the retrying task sends it.
    #[test]
    fn kept_releases_stay_until_a_decision_or_the_retry_takes_them() {
        let pending = Pending::new(Arc::new(NoStore));
        let a = pending.on_its_way("a".into(), 1);
        pending.keep("a", 1);
        assert!(on(&pending, "a", false).is_empty(), "no longer its task's");
        drop(a);
        assert_eq!(on(&pending, "a", true), [1], "its task's end leaves it");
        pending.keep("b", 2);
        let c = pending.on_its_way("c".into(), 3);
        let mut kept = pending.list(None, |r| r.kept);
        kept.sort();
        assert_eq!(kept, [("a".to_owned(), 1), ("b".to_owned(), 2)]);
        assert!(pending.remove("a", |_| true) && pending.remove("b", |_| true));
        assert_eq!(on(&pending, "c", false), [3], "a task's own stays");
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
