//! The background probe: while a scope is down, one task per backend
//! `PING`s each scope down once per probe interval.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::{Inner, RedisBackend};

/// The least time between two probes (with a probe interval of zero).
const MIN_GAP: Duration = Duration::from_millis(10);

/// The longest a probe's `PING` waits: a slower server is not back yet.
const PING_TIMEOUT: Duration = Duration::from_millis(250);

impl RedisBackend {
    /// Starts the background probe unless it runs.
    pub(crate) fn watch(&self) {
        let probing = &self.inner.probing;
        if probing.load(Ordering::Acquire) || probing.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(probe(Running(Arc::downgrade(&self.inner))))),
            Err(_) => probing.store(false, Ordering::Release),
        }
    }

    fn needs_probe(&self) -> bool {
        self.inner.health.any_down()
    }

    /// One round: a `PING` to each scope due.
    async fn probe_once(&self) {
        let inner = &self.inner;
        let timeout = inner.response_timeout.min(PING_TIMEOUT);
        let pings = inner
            .health
            .probes_due()
            .into_iter()
            .map(|scope| async move {
                if inner.conn.ping(scope, timeout).await {
                    inner.health.up(scope);
                }
            });
        futures::future::join_all(pings).await;
    }
}

/// The probe's task: a round per probe interval until it has no work; it
/// ends with the backend.
async fn probe(mut running: Running) {
    let inner = running.0.clone();
    loop {
        let Some(gap) = inner
            .upgrade()
            .map(|i| i.health.probe_interval.max(MIN_GAP))
        else {
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
        running.0 = Weak::new();
        backend.inner.probing.store(false, Ordering::Release);
        // Work that came meanwhile, whose `watch` found it still running.
        if !backend.needs_probe() || backend.inner.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        running.0 = Arc::downgrade(&backend.inner);
    }
}

/// The probe's task while it runs: dropped unfinished (its runtime shut
/// down), it lets the next call start a probe again.
struct Running(Weak<Inner>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use broker_core::{Cost, LimitSpec, Limits, RateLimit, Store};

    use broker_core::FailurePolicy;

    use crate::RedisBackend;

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
