//! Reachability of Redis per [`Scope`] (server or hash slot): outages are
//! logged and counted, and a scope that is down gets no call until the
//! background probe (one task per backend) finds it back with a `PING`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use broker_core::stats::BackendHealth;
use parking_lot::RwLock;

use crate::{ms, Inner, RedisBackend};

/// The part of the store a call needs: the one server, or on a cluster the
/// hash slot of its keys, whose node may be down while the others serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    Whole,
    #[cfg(feature = "cluster")]
    Slot(redis::cluster_routing::Slot),
}

impl Scope {
    /// The scope of the calls on state `key` (its hash tag's slot on a
    /// cluster).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) fn of(conn: &crate::connection::Conn, key: impl AsRef<[u8]>) -> Self {
        #[cfg(feature = "cluster")]
        if let crate::connection::Conn::Cluster(..) = conn {
            return Scope::Slot(redis::cluster_routing::Slot::for_key(key));
        }
        Scope::Whole
    }
}

/// How many outages (of any scope) had ended when a call went out.
pub(crate) type Epoch = u64;

/// At most this many down scopes are probed at once.
const PROBES_AT_ONCE: usize = 16;

/// The least time between two probes (with a probe interval of zero).
const MIN_GAP: Duration = Duration::from_millis(10);

/// The longest a probe's `PING` waits: a slower server is not back yet.
const PING_TIMEOUT: Duration = Duration::from_millis(250);

/// The health of every scope that has failed a call; while none is down,
/// a call reads two atomics and no lock (while one is, a read lock).
#[derive(Debug)]
pub(crate) struct Healths {
    pub(crate) probe_interval: Duration,
    epoch: AtomicU64,
    /// How many scopes are down.
    down: AtomicUsize,
    scopes: RwLock<HashMap<Scope, Health>>,
    /// Whether the background probe runs.
    probing: AtomicBool,
}

#[derive(Debug, Default)]
struct Health {
    down: bool,
    /// The epoch its last outage ended in: a failure of a call that went
    /// out before then starts no outage.
    up_at: Epoch,
    /// When the outage started, and before which no probe is sent (`None`:
    /// never).
    down_at: Option<Instant>,
    next_probe: Option<Instant>,
    outages: u64,
    handled: AtomicU64,
}

impl Healths {
    pub(crate) fn new(probe_interval: Duration) -> Self {
        Self {
            probe_interval,
            epoch: AtomicU64::new(0),
            down: AtomicUsize::new(0),
            scopes: RwLock::default(),
            probing: AtomicBool::new(false),
        }
    }

    /// `Some(epoch)` when a call on `scope` should go to Redis; `None`
    /// while the scope is down, the call then counted as answered by the
    /// policy.
    pub(crate) fn should_try(&self, scope: Scope) -> Option<Epoch> {
        if self.any_down() {
            if let Some(h) = self.scopes.read().get(&scope).filter(|h| h.down) {
                h.handled.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        // Read after the check: an outage that ends in between is one the
        // call goes out after.
        Some(self.epoch.load(Ordering::Acquire))
    }

    fn any_down(&self) -> bool {
        self.down.load(Ordering::Acquire) != 0
    }

    /// A call on `scope` reached Redis: ends its outage, if any.
    pub(crate) fn up(&self, scope: Scope) {
        if !self.any_down() {
            return;
        }
        let mut scopes = self.scopes.write();
        let Some(h) = scopes.get_mut(&scope).filter(|h| h.down) else {
            return;
        };
        h.down = false;
        h.up_at = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let last = self.down.fetch_sub(1, Ordering::AcqRel) == 1;
        let down_ms = h.down_at.map_or(0, |at| ms(at.elapsed()));
        let handled = h.handled.load(Ordering::Relaxed);
        drop(scopes);
        let msg = if scope == Scope::Whole {
            "redis reachable again; decisions are shared again"
        } else if last {
            "redis cluster slot reachable again, the last one down; its decisions are shared again"
        } else {
            "redis cluster slot reachable again; its decisions are shared again"
        };
        match last {
            true => tracing::info!(?scope, down_ms, handled, "{msg}"),
            false => tracing::debug!(?scope, down_ms, handled, "{msg}"),
        }
    }

    /// A call on `scope` that went out in `epoch` could not reach Redis:
    /// counted as answered by the policy; starts an outage unless one has
    /// started or ended since. Only the first scope down logs an error.
    pub(crate) fn failed(&self, scope: Scope, error: &str, epoch: Epoch) {
        let mut scopes = self.scopes.write();
        let h = scopes.entry(scope).or_default();
        h.handled.fetch_add(1, Ordering::Relaxed);
        if h.down || h.up_at > epoch {
            return;
        }
        let now = Instant::now();
        h.down = true;
        h.down_at = Some(now);
        h.next_probe = now.checked_add(self.probe_interval);
        h.outages += 1;
        let first = self.down.fetch_add(1, Ordering::AcqRel) == 0;
        drop(scopes);
        let msg = if scope == Scope::Whole {
            "redis unreachable; the failure policy answers until it returns"
        } else if first {
            "redis cluster slot unreachable; the failure policy answers its keys until it returns \
             (other slots that go down while one is are logged at debug level)"
        } else {
            "redis cluster slot unreachable; the failure policy answers its keys until it returns"
        };
        match first {
            true => tracing::error!(?scope, error, "{msg}"),
            false => tracing::debug!(?scope, error, "{msg}"),
        }
    }

    /// The down scopes due for a probe (each once per probe interval), at
    /// most [`PROBES_AT_ONCE`], the longest waiting first.
    pub(crate) fn probes_due(&self) -> Vec<Scope> {
        if !self.any_down() {
            return Vec::new();
        }
        let now = Instant::now();
        let mut scopes = self.scopes.write();
        let mut due: Vec<_> = scopes
            .iter_mut()
            .filter(|(_, h)| h.down && h.next_probe.is_some_and(|at| now >= at))
            .collect();
        due.sort_unstable_by_key(|(_, h)| h.next_probe);
        due.truncate(PROBES_AT_ONCE);
        let next = now.checked_add(self.probe_interval);
        due.into_iter()
            .map(|(scope, h)| {
                h.next_probe = next;
                *scope
            })
            .collect()
    }

    /// Down while any scope is; outages and handled calls summed.
    pub(crate) fn snapshot(&self) -> BackendHealth {
        let mut all = BackendHealth::default();
        for h in self.scopes.read().values() {
            all.down |= h.down;
            all.outages += h.outages;
            all.handled_errors += h.handled.load(Ordering::Relaxed);
        }
        all
    }
}

impl RedisBackend {
    /// Starts the background probe unless it runs.
    pub(crate) fn watch(&self) {
        let probing = &self.inner.health.probing;
        if probing.load(Ordering::Acquire) || probing.swap(true, Ordering::AcqRel) {
            return;
        }
        // With no runtime, dropped at once: not probing.
        let running = Running(Arc::downgrade(&self.inner));
        let gap = self.inner.health.probe_interval.max(MIN_GAP);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(probe(running, gap));
        }
    }
}

/// The probe's task: a `PING` to each scope due, every `gap`, until none is
/// down; it ends with the backend.
async fn probe(mut running: Running, gap: Duration) {
    let weak = running.0.clone();
    loop {
        tokio::time::sleep(gap).await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let (conn, health) = (&inner.conn, &inner.health);
        let timeout = inner.set.response_timeout.min(PING_TIMEOUT);
        let pings = health.probes_due().into_iter().map(|scope| async move {
            let ping = conn.send_to(scope, redis::cmd("PING"));
            if let Ok(Ok(_)) = tokio::time::timeout(timeout, ping).await {
                health.up(scope);
            }
        });
        futures::future::join_all(pings).await;
        if health.any_down() {
            continue;
        }
        running.0 = Weak::new();
        health.probing.store(false, Ordering::Release);
        // Work that came meanwhile, whose `watch` found it still running.
        if !health.any_down() || health.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        running.0 = Arc::downgrade(&inner);
    }
}

/// The probe's task while it runs: dropped unfinished (its runtime shut
/// down), it lets the next call start a probe again.
struct Running(Weak<Inner>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.health.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::{Cost, FailurePolicy, LimitSpec, Limits, RateLimit, Store};

    #[test]
    fn one_outage_is_logged_and_counted_once() {
        let h = Healths::new(Duration::from_secs(3600));
        let epoch = h.should_try(Scope::Whole).expect("up: every call goes out");
        h.failed(Scope::Whole, "refused", epoch);
        h.failed(Scope::Whole, "refused", epoch);
        assert!(
            h.should_try(Scope::Whole).is_none(),
            "down: no call goes out"
        );
        let s = h.snapshot();
        assert_eq!((s.down, s.outages, s.handled_errors), (true, 1, 3));
        h.up(Scope::Whole);
        assert!(h.should_try(Scope::Whole).is_some());
        assert!(!h.snapshot().down);
    }

    /// On a cluster, an outage is one slot's: the other slots' calls go
    /// out, and the backend reads as down while any slot is.
    #[cfg(feature = "cluster")]
    #[test]
    fn an_outage_of_one_slot_leaves_the_others_up() {
        use redis::cluster_routing::Slot;
        let h = Healths::new(Duration::from_secs(3600));
        let (dead, live) = (
            Scope::Slot(Slot::for_key("a")),
            Scope::Slot(Slot::for_key("b")),
        );
        assert_ne!(dead, live);
        let epoch = h.should_try(dead).expect("up");
        h.failed(dead, "no reply in time", epoch);
        assert!(h.should_try(dead).is_none(), "down: no call goes out");
        assert!(h.should_try(dead).is_none() && h.should_try(live).is_some());
        assert_eq!(h.should_try(live), Some(0));
        h.up(live);
        let s = h.snapshot();
        // The failed call, and the two kept back.
        assert_eq!((s.down, s.outages, s.handled_errors), (true, 1, 3));
        h.up(dead);
        assert!(!h.snapshot().down);
        assert_eq!(h.should_try(dead), Some(1), "the slot's next epoch");
    }

    /// A down slot is due for a probe once per probe interval, and not
    /// after its outage ended; no slot is while none is down.
    #[cfg(feature = "cluster")]
    #[test]
    fn a_down_slot_is_probed_once_per_interval() {
        use redis::cluster_routing::Slot;
        let h = Healths::new(Duration::from_millis(50));
        let dead = Scope::Slot(Slot::for_key("a"));
        assert!(h.probes_due().is_empty(), "none is down");
        let epoch = h.should_try(dead).expect("up");
        h.failed(dead, "no reply in time", epoch);
        assert!(h.probes_due().is_empty(), "not before the interval");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(h.probes_due(), [dead]);
        assert!(h.probes_due().is_empty(), "once per interval");
        h.up(dead);
        std::thread::sleep(Duration::from_millis(60));
        assert!(h.probes_due().is_empty(), "up again");
        assert!(!h.snapshot().down);
    }

    /// A failure of a call that went out before a recovery ends no outage
    /// and starts none; one that went out after it starts the next.
    #[test]
    fn a_failure_from_before_a_recovery_starts_no_outage() {
        let h = Healths::new(Duration::ZERO);
        let before = h.should_try(Scope::Whole).expect("up");
        h.failed(Scope::Whole, "no reply in time", before);
        assert!(
            h.should_try(Scope::Whole).is_none(),
            "down: no call goes out"
        );
        h.up(Scope::Whole);
        h.failed(Scope::Whole, "queued behind the timeout", before);
        let s = h.snapshot();
        // Two failed calls, and the one kept back.
        assert_eq!((s.down, s.outages, s.handled_errors), (false, 1, 3));
        let after = h.should_try(Scope::Whole).expect("up again");
        assert_ne!(after, before);
        h.failed(Scope::Whole, "refused", after);
        let s = h.snapshot();
        assert_eq!((s.down, s.outages), (true, 2), "a new outage");
    }

    /// An outage found on a runtime that then shuts down: the next call, on
    /// another runtime, starts a probe again, which finds Redis back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_dropped_with_its_runtime_is_started_again() {
        let server = broker_testkit::RedisServer::start();
        let backend = RedisBackend::builder(&server.url())
            .response_timeout(Duration::from_millis(300))
            .probe_interval(Duration::from_millis(20))
            .connect_with_policy(FailurePolicy::FailOpen)
            .await
            .unwrap();
        let spec = LimitSpec::new(
            &Limits::new().rate(RateLimit::per_second(1000)),
            Duration::from_secs(30),
        );
        let warm = backend.try_acquire("r", &spec, Cost::default()).await;
        assert!(!warm.unwrap().answered_here);
        server.pause();
        let (b, s) = (backend.clone(), spec.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let d = rt.block_on(b.try_acquire("r", &s, Cost::default()));
            assert!(d.unwrap().answered_here, "no reply in time");
            // The runtime shuts down, with the probe it started.
        })
        .join()
        .unwrap();
        assert!(backend.health().down);
        server.resume();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let d = backend.try_acquire("r", &spec, Cost::default()).await;
            if !d.unwrap().answered_here {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "Redis is found back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
