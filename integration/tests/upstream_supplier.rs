//! Supplier bucket classes: an auth bucket per credential that waits and
//! never shares budget with data, data buckets per endpoint class that skip
//! and reschedule, an informational egress-IP bucket, and keys and logs that
//! hold a credential's fingerprint, never its secret.

mod upstream_support;

use std::net::IpAddr;
use std::time::Duration;

use broker_core::config::{self, Format};
use broker_core::keys;
use broker_core::supplier::{
    Admission, BucketClass, BucketKey, Credential, SupplierBuckets, SupplierConfig,
};
use broker_testkit::capture_logs;
use tokio::time::Instant;
use upstream_support::memory_broker;

const ETM: &str = "
rate_limit:
  auth:
    login: { rate: 1, period: 120s, mode: wait }
  data:
    price:
      rate: 1
      period: 1s
      mode: skip_and_reschedule
      backoff: { initial: 500ms, max: 30s, factor: 2 }
    goods: { rate: 1, period: 1s }
  egress_ip: true
";

const SECRET: &str = "etm-user:correct-horse-battery-staple";

fn etm() -> SupplierBuckets {
    let config = config::parse::<SupplierConfig>("etm.yaml", ETM, Format::Yaml).unwrap();
    SupplierBuckets::register(&memory_broker(), "etm", &config).unwrap()
}

fn skipped(a: Admission) -> (Duration, Duration) {
    match a {
        Admission::Skipped {
            retry_in, backoff, ..
        } => (retry_in, backoff),
        Admission::Go(_) => panic!("expected a skip"),
    }
}

#[tokio::test(start_paused = true)]
async fn auth_never_shares_budget_with_data() {
    let etm = etm();
    let who = Credential::from_secret(SECRET);
    // Spend and penalize every data class of this credential.
    for class in ["price", "goods"] {
        assert!(etm.data(class, &who, 0).await.unwrap().is_go());
        assert!(!etm.data(class, &who, 0).await.unwrap().is_go());
        let key = BucketKey::new("etm", BucketClass::Data, class, &who);
        etm.broker()
            .penalize(key.target(), Duration::from_secs(600))
            .await
            .unwrap();
    }
    let start = Instant::now();
    let _login = etm.auth("login", &who).await.unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "login must not wait for data"
    );
}

#[tokio::test(start_paused = true)]
async fn data_skips_to_the_moment_the_bucket_opens_with_growing_backoff() {
    let etm = etm();
    let who = Credential::from_secret(SECRET);
    assert!(etm.data("price", &who, 0).await.unwrap().is_go());
    // The bucket opens in 1 s; the first backoff is 500 ms.
    let (retry_in, backoff) = skipped(etm.data("price", &who, 0).await.unwrap());
    assert_eq!(backoff, Duration::from_millis(500));
    assert_eq!(retry_in, Duration::from_secs(1));
    // Repeated skips back off further: 500 ms × 2^3, then capped at 30 s.
    let (retry_in, backoff) = skipped(etm.data("price", &who, 3).await.unwrap());
    assert_eq!(
        (retry_in, backoff),
        (Duration::from_secs(4), Duration::from_secs(4))
    );
    let (_, backoff) = skipped(etm.data("price", &who, 20).await.unwrap());
    assert_eq!(backoff, Duration::from_secs(30));
    // Another credential has its own bucket.
    let other = Credential::from_secret("another-user:pw");
    assert!(etm.data("price", &other, 0).await.unwrap().is_go());
    // Rescheduled to the moment it opens, the job goes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(etm.data("price", &who, 1).await.unwrap().is_go());
    let stats = &etm.broker().stats().resources["etm/data/price"];
    assert_eq!(stats.skipped, 3);
}

#[tokio::test(start_paused = true)]
async fn auth_waits_past_the_ceiling_and_never_fails_on_rate() {
    let etm = etm();
    let who = Credential::from_secret(SECRET);
    let _first = etm.auth("login", &who).await.unwrap();
    // A penalty of an hour: far beyond the 241 s ceiling of a 1/120 s bucket.
    let key = BucketKey::new("etm", BucketClass::Auth, "login", &who);
    etm.broker()
        .penalize(key.target(), Duration::from_secs(3600))
        .await
        .unwrap();
    let start = Instant::now();
    let _second = etm.auth("login", &who).await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(3600), "{waited:?}");
    assert!(waited < Duration::from_secs(3600 + 241), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn keys_and_logs_carry_the_fingerprint_never_the_secret() {
    let (logs, _guard) = capture_logs(tracing::Level::TRACE);
    let etm = etm();
    let who = Credential::from_secret(SECRET);
    assert!(etm.data("price", &who, 0).await.unwrap().is_go());
    assert!(!etm.data("price", &who, 0).await.unwrap().is_go());
    let auth = BucketKey::new("etm", BucketClass::Auth, "login", &who);
    let data = BucketKey::new("etm", BucketClass::Data, "price", &who);
    assert_ne!(auth.resource, data.resource);
    for key in [&auth, &data].map(|k| keys::keyed(&k.resource, &k.sub_key)) {
        assert!(key.ends_with(who.fingerprint()), "{key}");
        assert!(!key.contains("horse"), "{key}");
    }
    assert!(!format!("{who:?} {auth:?}").contains("horse"));
    let text = logs.text();
    assert!(text.contains("skip and reschedule"), "{text}");
    assert!(text.contains(who.fingerprint()), "{text}");
    assert!(!text.contains("horse"), "{text}");
}

#[test]
fn a_bucket_id_escapes_each_name_as_a_key_part_and_its_slashes() {
    let who = Credential::from_secret(SECRET);
    let key = BucketKey::new("a/b:c", BucketClass::Data, "x/y{z}", &who);
    assert_eq!(key.resource, "a%2Fb%3Ac/data/x%2Fy%7Bz%7D");
}

#[tokio::test(start_paused = true)]
async fn egress_bucket_only_counts_and_notices_a_new_ip() {
    let (logs, _guard) = capture_logs(tracing::Level::INFO);
    let etm = etm();
    let a: IpAddr = "203.0.113.7".parse().unwrap();
    let b: IpAddr = "203.0.113.8".parse().unwrap();
    for _ in 0..1000 {
        etm.note_egress(a);
    }
    assert_eq!(etm.note_egress(b), 1);
    let counts = etm.egress_counts();
    assert_eq!(counts[&a], 1000);
    assert_eq!(counts[&b], 1);
    assert!(logs.text().contains("new egress IP"), "{}", logs.text());
}

/// A supplier's buckets are limit-only resources in the stats (they are
/// checked, never queued).
#[tokio::test(start_paused = true)]
async fn supplier_buckets_are_limit_only_in_the_stats() {
    let etm = etm();
    let stats = etm.broker().stats();
    assert!(!stats.resources.is_empty());
    for (id, s) in &stats.resources {
        assert_eq!(s.kind, broker_core::ResourceKind::LimitOnly, "{id}");
    }
}

/// A supplier's buckets are registered as one step: one that cannot be
/// (its id is the application's queue) leaves none of them registered.
/// Before, the supplier took the queue over as a bucket of its own, and
/// its registration succeeded.
#[test]
fn a_supplier_whose_bucket_is_refused_registers_none() {
    let broker = memory_broker();
    let queue = broker_core::ResourceConfig::new(
        broker_core::Limits::new().rate(broker_core::RateLimit::per_second(5)),
    );
    broker.register("etm/data/price", queue).unwrap();
    let config = config::parse::<SupplierConfig>("etm.yaml", ETM, Format::Yaml).unwrap();
    let refused = SupplierBuckets::register(&broker, "etm", &config).unwrap_err();
    assert!(
        refused.to_string().starts_with("rate_limit.data.price: ")
            && refused.to_string().contains("etm/data/price"),
        "{refused}"
    );
    assert!(broker.limits("etm/auth/login").is_err());
    assert!(broker.limits("etm/data/goods").is_err());
}

/// No two (supplier, class, endpoint) share a bucket: a `/` in a
/// supplier's or an endpoint's name is escaped in the bucket's id. Before,
/// supplier `a/auth` with data endpoint `x` and supplier `a` with auth
/// endpoint `data/x` were both `a/auth/data/x`, and the second one's
/// registration re-configured the first's bucket.
#[test]
fn a_slash_in_a_name_does_not_make_two_buckets_one() {
    let broker = memory_broker();
    let data = "rate_limit:\n  data:\n    x: { rate: 1, period: 1s }\n";
    let auth = "rate_limit:\n  auth:\n    \"data/x\": { rate: 5, period: 1s, mode: wait }\n";
    let parse = |text| config::parse::<SupplierConfig>("s.yaml", text, Format::Yaml).unwrap();
    SupplierBuckets::register(&broker, "a/auth", &parse(data)).unwrap();
    SupplierBuckets::register(&broker, "a", &parse(auth)).unwrap();
    let ids: Vec<String> = broker.stats().resources.into_keys().collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
}
