//! The background probe: while a part of the store is down (the server, or
//! a hash slot of a cluster) or releases are kept (see `pending.rs`), one
//! task per backend sends a `PING` to each part down once per probe
//! interval, with a timeout of its own. A part that answers is up again,
//! and the releases kept for it are sent. No caller waits for it: while a
//! part is down, its calls are answered by the failure policy at once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::failure::Scope;
use crate::{Inner, RedisBackend};

/// The least time between two probes (with a probe interval of zero).
const MIN_GAP: Duration = Duration::from_millis(10);

impl RedisBackend {
    /// Starts the background probe unless it runs (a part of the store is
    /// down, or a release is kept).
    pub(crate) fn watch(&self) {
        let probing = &self.inner.probing;
        if probing.load(Ordering::Acquire) || probing.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(probe(Arc::downgrade(&self.inner)))),
            // No runtime (it is shutting down): nothing to probe for.
            Err(_) => probing.store(false, Ordering::Release),
        }
    }

    /// Whether the probe has work: a part of the store down, a release
    /// kept.
    fn needs_probe(&self) -> bool {
        self.inner.health.any_down() || self.inner.pending.any_kept()
    }

    /// One round of the probe: a `PING` to each part down (on a cluster,
    /// at most `PROBES_AT_ONCE` slots, the longest waiting first), each
    /// within the response timeout; then the kept releases of the parts
    /// that are up are sent.
    async fn probe_once(&self) {
        let inner = &self.inner;
        let timeout = inner.response_timeout;
        if inner.health.is_down(Scope::Whole) && inner.conn.ping(timeout).await {
            inner.health.up(Scope::Whole);
        }
        #[cfg(feature = "cluster")]
        {
            let pings = inner
                .health
                .probes_due()
                .into_iter()
                .map(|slot| async move { (slot, inner.conn.ping_slot(slot, timeout).await) });
            for (slot, answered) in futures::future::join_all(pings).await {
                if answered {
                    inner.health.up(Scope::Slot(slot));
                }
            }
        }
        let kept = inner
            .pending
            .take_kept(|key| !inner.health.is_down(self.scope(key)));
        for (key, lease) in kept {
            // Kept again if Redis cannot be reached.
            let _ = broker_core::Backend::release(self, &key, lease).await;
        }
    }
}

/// The probe's task: a round per probe interval until it has no work; it
/// ends with the backend.
async fn probe(inner: Weak<Inner>) {
    loop {
        let Some(gap) = inner.upgrade().map(|i| i.probe_interval.max(MIN_GAP)) else {
            return;
        };
        tokio::time::sleep(gap).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let backend = RedisBackend { inner };
        backend.probe_once().await;
        if backend.needs_probe() {
            continue;
        }
        backend.inner.probing.store(false, Ordering::Release);
        // Work that came meanwhile, whose `watch` found it still running.
        if !backend.needs_probe() || backend.inner.probing.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}
