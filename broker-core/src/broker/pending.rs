//! Dropped permits' releases not yet sent to a store with I/O. A decision
//! on a key sends that key's first, so it never overtakes an earlier release;
//! those a down store cannot take are resent once it reads up.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::keeper::Keeper;
use super::Resource;
use crate::error::BackendError;
use crate::state::{LeaseId, LimitSpec};

/// Most releases pending; past it, one that cannot reach the store is left
/// to its lease's TTL.
const MAX_KEPT: usize = 100_000;

/// The first and the longest wait between two reads of the store's health
/// while releases wait for it to read up.
const RETRY: [Duration; 2] = [Duration::from_millis(50), Duration::from_millis(500)];

/// `decision`, which may take a slot on state `key` of `resource` under
/// `spec`, after the releases pending on `key`; both within one bound.
pub(crate) async fn in_order<T>(
    resource: &Resource,
    key: &str,
    spec: &LimitSpec,
    decision: impl Future<Output = T>,
) -> T {
    let keeper = resource
        .keeper
        .as_ref()
        .filter(|_| spec.max_concurrent.is_some());
    let Some(p) = keeper.filter(|p| p.count.load(Ordering::Acquire) != 0) else {
        return decision.await;
    };
    let ahead = async {
        let leases = p.by_key.lock().remove(key).unwrap_or_default();
        p.count.fetch_sub(leases.len(), Ordering::Release);
        for lease in leases {
            // One out of reach goes back on its way, as a dropped permit's.
            let released = p.backend.release(key, lease).await;
            if released.is_err_and(|e| e.is_unavailable()) {
                tokio::spawn(p.on_its_way(key.to_owned(), lease));
            }
        }
        decision.await
    };
    crate::store::BEGUN
        .scope(tokio::time::Instant::now(), ahead)
        .await
}

/// The releases not yet sent, by state key.
impl Keeper {
    /// Waits until the store reads up: one waiter at a time reads its
    /// health, so one reads for all; if it is dropped, the next takes over.
    async fn until_up(&self) {
        let _reading = self.reader.lock().await;
        let mut wait = RETRY[0];
        while self.backend.health().down {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RETRY[1]);
        }
    }

    /// Whether `lease` on `key` is pending; taken out if `take`.
    fn pending(&self, key: &str, lease: LeaseId, take: bool) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut map = self.by_key.lock();
        let Some(leases) = map.get_mut(key) else {
            return false;
        };
        let Some(at) = leases.iter().position(|l| *l == lease) else {
            return false;
        };
        if take {
            leases.swap_remove(at);
            self.count.fetch_sub(1, Ordering::Release);
            if leases.is_empty() {
                map.remove(key);
            }
        }
        true
    }

    /// The release of `lease` on `key`, for a task: pending until dropped;
    /// not sent if a decision took it out; out of reach of a down store, sent
    /// again once it reads up (past [`MAX_KEPT`] pending, left to its TTL).
    pub(crate) fn on_its_way(
        self: &Arc<Self>,
        key: String,
        lease: LeaseId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send + 'static {
        self.by_key
            .lock()
            .entry(key.clone())
            .or_default()
            .push(lease);
        self.count.fetch_add(1, Ordering::Release);
        let pending = scopeguard::guard((self.clone(), key), move |(pending, key)| {
            pending.pending(&key, lease, true);
        });
        async move {
            let (pending, key) = (&pending.0, pending.1.as_str());
            loop {
                if !pending.pending(key, lease, false) {
                    return Ok(true);
                }
                let released = pending.backend.release(key, lease).await;
                let out_of_reach = released.as_ref().is_err_and(BackendError::is_unavailable);
                let kept = pending.count.load(Ordering::Relaxed) <= MAX_KEPT;
                if !(out_of_reach && kept && pending.backend.health().down) {
                    return released;
                }
                pending.until_up().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::tests::NoStore;
    use crate::store::Store;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    #[test]
    fn leases_are_kept_by_key_until_answered_or_taken() {
        let pending = Arc::new(Keeper::new(Arc::new(NoStore)));
        assert!(!pending.pending("a", 1, false));
        let ways = [("a", 1), ("a", 2), ("b", 3)].map(|(k, l)| pending.on_its_way(k.into(), l));
        assert!(pending.pending("a", 1, false));
        assert!(pending.pending("a", 1, true));
        assert!(!pending.pending("a", 1, true));
        assert!(!pending.pending("a", 1, false));
        assert!(pending.pending("a", 2, true), "a decision sent it");
        assert!(!pending.pending("a", 2, true), "taken once");
        assert!(pending.pending("b", 3, false));
        drop(ways);
        assert!(
            !pending.pending("b", 3, false),
            "its task's end takes it out"
        );
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.by_key.lock().is_empty());
    }

    /// Release tasks dropped unrun with their runtime leave nothing
    /// pending.
    #[test]
    fn a_release_whose_task_never_ran_does_not_stay_pending() {
        let pending = Arc::new(Keeper::new(Arc::new(NoStore)));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in 0..100 {
                let release = pending.on_its_way(format!("t{i}"), i);
                tokio::spawn(release);
            }
        });
        assert_eq!(pending.count.load(Ordering::Relaxed), 100);
        drop(rt);
        assert_eq!(pending.count.load(Ordering::Relaxed), 0);
        assert!(pending.by_key.lock().is_empty());
    }

    /// A store out of reach while `down`: releases fail as unreachable.
    #[derive(Default)]
    struct Away {
        down: AtomicBool,
        released: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Store for Away {
        async fn try_acquire(
            &self,
            k: &str,
            s: &LimitSpec,
            c: crate::Cost,
        ) -> Result<crate::Decision, BackendError> {
            NoStore.try_acquire(k, s, c).await
        }
        async fn book(
            &self,
            k: &str,
            s: &LimitSpec,
            c: crate::Cost,
            w: Duration,
        ) -> Result<crate::state::Booking, BackendError> {
            NoStore.book(k, s, c, w).await
        }
        async fn take_slot(&self, k: &str, s: &LimitSpec) -> Result<Option<LeaseId>, BackendError> {
            NoStore.take_slot(k, s).await
        }
        async fn release(&self, _: &str, _: LeaseId) -> Result<bool, BackendError> {
            if self.down.load(Ordering::Acquire) {
                return Err(BackendError::unavailable("away"));
            }
            self.released.fetch_add(1, Ordering::AcqRel);
            Ok(true)
        }
        async fn settle(
            &self,
            k: &str,
            s: &LimitSpec,
            b: crate::Cost,
            a: crate::Cost,
            m: Option<crate::state::Marks>,
        ) -> Result<(), BackendError> {
            NoStore.settle(k, s, b, a, m).await
        }
        async fn penalize(&self, k: &str, s: &LimitSpec, p: Duration) -> Result<(), BackendError> {
            NoStore.penalize(k, s, p).await
        }
        async fn reconcile(
            &self,
            k: &str,
            s: &LimitSpec,
            o: &crate::ObservedLimit,
        ) -> Result<(), BackendError> {
            NoStore.reconcile(k, s, o).await
        }
        fn health(&self) -> crate::stats::BackendHealth {
            let down = self.down.load(Ordering::Acquire);
            crate::stats::BackendHealth {
                down,
                ..Default::default()
            }
        }
    }

    /// The waiter reading the store's health for the others is cancelled:
    /// another takes over, and every release left is sent once it is up.
    #[tokio::test(start_paused = true)]
    async fn releases_kept_while_down_are_sent_when_their_reader_is_gone() {
        let store = Arc::new(Away::default());
        store.down.store(true, Ordering::Release);
        let pending = Arc::new(Keeper::new(store.clone()));
        let tasks: Vec<_> = (0..3)
            .map(|i| tokio::spawn(pending.on_its_way("k".into(), i)))
            .collect();
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(pending.reader.try_lock().is_err(), "one reads for all");
        tasks[0].abort();
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(pending.reader.try_lock().is_err(), "another took over");
        store.down.store(false, Ordering::Release);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut sent = 0;
        for task in tasks {
            match task.await {
                Ok(answer) => sent += usize::from(answer.unwrap()),
                Err(e) => assert!(e.is_cancelled()),
            }
        }
        assert_eq!(sent, 2);
        assert_eq!(store.released.load(Ordering::Acquire), 2);
        assert!(pending.by_key.lock().is_empty());
        assert!(pending.reader.try_lock().is_ok());
    }
}
