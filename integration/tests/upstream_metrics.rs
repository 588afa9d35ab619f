//! The counters tell apart a local limiter wait, an upstream 429, an
//! exhausted retry budget, a skip-and-reschedule, a reconcile and a backend
//! error, both in `stats()` and through the `metrics` facade.

mod upstream_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use broker_core::config::{self, Format};
use broker_core::supplier::{Credential, SupplierBuckets, SupplierConfig};
use broker_core::{
    Cost, EnqueueError, Limits, Observed, ObservedLimit, Outcome, RateLimit, ResourceBroker,
    ResourceConfig, RetryPolicy,
};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use upstream_support::memory_broker;

/// Counts increments by `name{label=value,...}`.
#[derive(Default)]
struct Tally(Mutex<BTreeMap<String, u64>>);

struct Cell {
    name: String,
    tally: &'static Tally,
}

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        *self
            .tally
            .0
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += n;
    }
    fn absolute(&self, n: u64) {
        self.tally.0.lock().unwrap().insert(self.name.clone(), n);
    }
}

struct TallyRecorder(&'static Tally);

impl Recorder for TallyRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Counter::from_arc(Arc::new(Cell {
            name,
            tally: self.0,
        }))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn tally() -> &'static Tally {
    static TALLY: OnceLock<&'static Tally> = OnceLock::new();
    TALLY.get_or_init(|| {
        let t: &'static Tally = Box::leak(Box::default());
        metrics::set_global_recorder(TallyRecorder(t)).expect("one recorder per test binary");
        t
    })
}

fn count(name: &str) -> u64 {
    tally().0.lock().unwrap().get(name).copied().unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn each_kind_of_delay_and_failure_has_its_own_counter() {
    tally();
    let broker = memory_broker();
    let one_per_second = Limits::new().rate(RateLimit::per_second(1));
    let once = RetryPolicy {
        max_attempts: 2,
        ..RetryPolicy::default()
    };
    broker
        .register(
            "llm",
            ResourceConfig {
                retry: once,
                ..ResourceConfig::new(one_per_second.clone())
            },
        )
        .unwrap();

    // Two jobs at once: the second waits on the local limiter.
    let ok = || async { Outcome::<(), &str>::ok(()) };
    let (a, b) = tokio::join!(
        broker.enqueue("llm", Cost::default(), |_| ok()),
        broker.enqueue("llm", Cost::default(), |_| ok())
    );
    a.unwrap();
    b.unwrap();

    // A job the upstream refuses twice: two 429s, then the budget is spent.
    let r: Result<(), EnqueueError<&str>> = broker
        .enqueue("llm", Cost::default(), |_| async {
            Outcome::rate_limited("429", None)
        })
        .await;
    assert!(matches!(r, Err(EnqueueError::RetriesExhausted { .. })));

    // Headers that narrow the bucket: one reconcile.
    let narrow = ObservedLimit {
        requests: Some(Observed {
            limit: Some(1),
            remaining: Some(0),
            reset: Some(Duration::from_secs(1)),
            ..Default::default()
        }),
        ..ObservedLimit::default()
    };
    broker.reconcile("llm", &narrow).await.unwrap();

    // A data bucket that skips.
    let config = config::parse::<SupplierConfig>(
        "s.yaml",
        "rate_limit:\n  data:\n    price: { rate: 1, period: 1s }\n",
        Format::Yaml,
    )
    .unwrap();
    let supplier = SupplierBuckets::register(&broker, "etm", &config).unwrap();
    let who = Credential::from_secret("pw");
    assert!(supplier.data("price", &who, 0).await.unwrap().is_go());
    assert!(!supplier.data("price", &who, 0).await.unwrap().is_go());

    // A backend that is down.
    let down = ResourceBroker::new(broker_testkit::DownBackend::new("down"));
    down.register_limit("gw", one_per_second).unwrap();
    assert!(down.try_acquire("gw", Cost::default()).await.is_err());

    let llm = &broker.stats().resources["llm"];
    assert_eq!(
        (
            llm.local_waits,
            llm.upstream_429,
            llm.retries_exhausted,
            llm.reconciles
        ),
        (2, 2, 1, 1),
        "{llm:?}"
    );
    assert_eq!(broker.stats().resources["etm/data/price"].skipped, 1);
    assert_eq!(down.stats().resources["gw"].backend_errors, 1);

    let m = |name: &str| count(name);
    assert_eq!(m("resource_broker_local_waits_total{resource=llm}"), 2);
    assert_eq!(m("resource_broker_upstream_429_total{resource=llm}"), 2);
    assert_eq!(
        m("resource_broker_retries_exhausted_total{resource=llm}"),
        1
    );
    assert_eq!(m("resource_broker_reconciles_total{resource=llm}"), 1);
    assert_eq!(
        m("resource_broker_skipped_total{resource=etm/data/price}"),
        1
    );
    assert_eq!(
        m("resource_broker_backend_errors_total{resource=gw,op=try_acquire}"),
        1
    );
    // Allowed requests are not counted one by one.
    let names: Vec<String> = tally().0.lock().unwrap().keys().cloned().collect();
    assert!(names.iter().all(|n| !n.contains("allowed")), "{names:?}");
}
