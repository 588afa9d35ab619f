//! What the backend does while Redis is unreachable: the [`FailurePolicy`],
//! and the [`Health`] tracker that logs once per outage, counts the calls the
//! policy answered and lets one probe per interval through to Redis.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use broker_core::bucket::BucketParams;
use broker_core::stats::BackendHealth;
use broker_core::{BackendError, Cost, LimitSpec};

/// What the backend answers while Redis is unreachable (connection refused
/// or dropped, timeouts, cluster down, a loading or read-only server).
/// Script and command errors are never covered: they are returned.
///
/// The default is [`FailurePolicy::FailClosed`]: it is the only policy that
/// can never let more through than the shared quota, however many replicas
/// run. [`FailurePolicy::LocalFallback`] is safe only if `share` × the
/// number of replicas is at most 1, which this library cannot know;
/// [`FailurePolicy::FailOpen`] trades the quota for availability.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum FailurePolicy {
    /// Every call returns a [`BackendError`]: `try_acquire` and `enqueue`
    /// fail, `release` is left to the lease's expiry, `penalize`,
    /// `reconcile` and `settle` are lost.
    #[default]
    FailClosed,
    /// Every acquisition is allowed at once; `penalize`, `reconcile` and
    /// `settle` are dropped.
    FailOpen,
    /// Decisions come from buckets in this process holding `share`
    /// (0 < share ≤ 1) of every limit: bursts times `share` (fractional
    /// bursts are kept, never rounded up), periods stretched by `1 / share`
    /// (rounded up to a whole µs), concurrency limits times `share` rounded
    /// down. A limit too small to split (a burst times `share` below the
    /// cost, a concurrency limit that rounds down to 0) admits nothing
    /// locally: a full bucket per process is never handed out, and such a
    /// call fails with a [`BackendError`] that says so, as under
    /// [`FailurePolicy::FailClosed`] (not a denial whose wait would never
    /// come true, nor a booking that would take more than the share). Set
    /// `share` to `1 / replicas` or less to keep the sum within the quota.
    LocalFallback {
        /// The fraction of every limit this process may use alone.
        share: f64,
    },
}

impl FailurePolicy {
    /// `"fail_closed"`, `"fail_open"` or `"local_fallback"` (metric labels).
    pub fn name(&self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::LocalFallback { .. } => "local_fallback",
        }
    }

    /// Whether a decision Redis granted after its caller was answered by
    /// this policy (a timeout) gives its cost back: not under fail-open,
    /// whose call went out (see `coalesce::Late`).
    pub(crate) fn refunds_late(&self) -> bool {
        *self != FailurePolicy::FailOpen
    }

    /// Checks `share` of [`FailurePolicy::LocalFallback`].
    pub(crate) fn validate(&self) -> Result<(), BackendError> {
        if let FailurePolicy::LocalFallback { share } = *self {
            if !(share > 0.0 && share <= 1.0) {
                return Err(BackendError::new(format!(
                    "LocalFallback share must be in (0, 1], got {share}"
                )));
            }
        }
        Ok(())
    }
}

/// The limits of `spec` scaled down to `share` for a local fallback bucket.
pub(crate) fn scaled(spec: &LimitSpec, share: f64) -> LimitSpec {
    LimitSpec {
        buckets: spec
            .buckets
            .iter()
            .map(|(unit, p)| {
                (
                    *unit,
                    BucketParams::new(
                        p.capacity() * share,
                        p.amount(),
                        (p.period() / share).ceil(),
                    ),
                )
            })
            .collect(),
        max_concurrent: spec
            .max_concurrent
            .map(|m| (m as f64 * share).floor() as u32),
        lease_ttl: spec.lease_ttl,
    }
}

/// Why the local fallback's `scaled` limits (at `share`) can never admit
/// `cost`, with a slot if `slot`: a bucket whose share is smaller than the
/// cost, or a concurrency limit that rounds down to no slot. `None` when
/// they can.
pub(crate) fn never_admits(
    scaled: &LimitSpec,
    share: f64,
    cost: Cost,
    slot: bool,
) -> Option<String> {
    if slot && scaled.max_concurrent == Some(0) {
        return Some(format!(
            "the local fallback's share {share} of the concurrency limit is no slot"
        ));
    }
    scaled.buckets.iter().find_map(|(unit, p)| {
        let c = cost.of(*unit);
        (c as f64 > p.capacity()).then(|| {
            format!(
                "the local fallback's share {share} of a limit holds {} {}, less than the cost {c}",
                p.capacity(),
                unit.as_str()
            )
        })
    })
}

/// Reachability of the store, as seen by the calls.
#[derive(Debug)]
pub(crate) struct Health {
    down: AtomicBool,
    origin: Instant,
    /// Milliseconds since `origin` before which no probe is sent.
    next_probe_ms: AtomicU64,
    probe_interval: Duration,
    outages: AtomicU64,
    handled: AtomicU64,
    down_since: Mutex<Option<Instant>>,
}

impl Health {
    pub(crate) fn new(probe_interval: Duration) -> Self {
        Self {
            down: AtomicBool::new(false),
            origin: Instant::now(),
            next_probe_ms: AtomicU64::new(0),
            probe_interval,
            outages: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            down_since: Mutex::new(None),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether this call should go to Redis: always while it is up; while
    /// it is down, one call per probe interval.
    pub(crate) fn should_try(&self) -> bool {
        if !self.down.load(Ordering::Relaxed) {
            return true;
        }
        let now = self.elapsed_ms();
        let next = self.next_probe_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_probe_ms
                .compare_exchange(
                    next,
                    now + self.probe_interval.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// A call reached Redis: ends an outage, if there was one.
    pub(crate) fn up(&self) {
        if self.down.load(Ordering::Relaxed) && self.down.swap(false, Ordering::Relaxed) {
            let since = self
                .down_since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let down_ms = since.map_or(0, |s| s.elapsed().as_millis() as u64);
            tracing::info!(
                down_ms,
                handled = self.handled.load(Ordering::Relaxed),
                "redis reachable again; decisions are shared again"
            );
        }
    }

    /// Redis could not be reached (`error` is `None` for a call that the
    /// probe gate kept from trying). Starts an outage on the first failure
    /// and logs it once; counts the call as handled by the policy.
    pub(crate) fn failed(&self, policy: &FailurePolicy, error: Option<&str>) {
        self.handled.fetch_add(1, Ordering::Relaxed);
        broker_core::telemetry::fallback_used(policy.name(), "call");
        if let Some(error) = error {
            if !self.down.swap(true, Ordering::Relaxed) {
                *self.down_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                self.next_probe_ms.store(
                    self.elapsed_ms() + self.probe_interval.as_millis() as u64,
                    Ordering::Relaxed,
                );
                self.outages.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    ?policy,
                    error,
                    "redis unreachable; the failure policy answers until it returns"
                );
            }
        }
    }

    pub(crate) fn snapshot(&self) -> BackendHealth {
        BackendHealth {
            down: self.down.load(Ordering::Relaxed),
            outages: self.outages.load(Ordering::Relaxed),
            handled_errors: self.handled.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::{Limits, RateLimit};

    #[test]
    fn fallback_limits_are_a_fraction_never_the_full_bucket() {
        let limits = Limits::new()
            .rate(RateLimit::per_second(10).with_burst(10))
            .max_concurrent(4);
        let spec = LimitSpec::new(&limits, Duration::from_secs(30));
        let half = scaled(&spec, 0.5);
        let p = half.buckets[0].1;
        assert_eq!(p.capacity(), 5.0);
        assert_eq!(p.amount() / p.period() * 1e6, 5.0);
        assert_eq!(half.max_concurrent, Some(2));
        let tiny = Limits::new()
            .rate(RateLimit::per_second(1).with_burst(1))
            .max_concurrent(1);
        let tiny = scaled(&LimitSpec::new(&tiny, Duration::from_secs(30)), 0.5);
        assert_eq!(
            tiny.buckets[0].1.capacity(),
            0.5,
            "never rounded up to a full bucket"
        );
        assert_eq!(tiny.max_concurrent, Some(0));
    }

    #[test]
    fn share_outside_zero_to_one_is_refused() {
        for share in [0.0, -1.0, 1.5, f64::NAN] {
            assert!(FailurePolicy::LocalFallback { share }.validate().is_err());
        }
        assert!(FailurePolicy::LocalFallback { share: 1.0 }
            .validate()
            .is_ok());
    }

    #[test]
    fn one_outage_is_logged_and_counted_once() {
        let h = Health::new(Duration::from_secs(3600));
        let p = FailurePolicy::FailOpen;
        h.failed(&p, Some("refused"));
        h.failed(&p, Some("refused"));
        assert!(!h.should_try(), "no probe before the interval");
        h.failed(&p, None);
        let s = h.snapshot();
        assert_eq!((s.down, s.outages, s.handled_errors), (true, 1, 3));
        h.up();
        assert!(h.should_try());
        assert!(!h.snapshot().down);
    }
}
