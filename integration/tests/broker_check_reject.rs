//! Check + reject on the in-memory backend: `try_acquire`, `acquire`,
//! permits, errors.

use std::time::Duration;

use broker_core::{
    BrokerError, Cost, DenyReason, Limits, ManualClock, RateLimit, ResourceBroker, ResourceKind,
    Target, TokioClock, Unit,
};
use broker_memory::MemoryBackend;

/// Whether one `try_acquire` is allowed.
async fn allowed<'a>(broker: &ResourceBroker, target: impl Into<Target<'a>>, cost: Cost) -> bool {
    broker.try_acquire(target, cost).await.unwrap().allowed
}

fn broker_at(clock: ManualClock) -> ResourceBroker {
    ResourceBroker::new(MemoryBackend::with_clock(clock))
}

#[tokio::test]
async fn denial_reports_the_wait_until_the_next_token() {
    let clock = ManualClock::new();
    let broker = broker_at(clock.clone());
    broker
        .register_limit("api", Limits::new().rate(RateLimit::per_second(2)))
        .unwrap();
    assert!(allowed(&broker, "api", Cost::default()).await);
    assert!(allowed(&broker, "api", Cost::default()).await);
    let denied = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.denied_by, Some(DenyReason::Rate));
    assert_eq!(denied.wait_time, Duration::from_millis(500));
    clock.advance(Duration::from_millis(499));
    assert!(!allowed(&broker, "api", Cost::default()).await);
    clock.advance(Duration::from_millis(1));
    assert!(allowed(&broker, "api", Cost::default()).await);
}

#[tokio::test]
async fn all_limits_pass_or_nothing_is_consumed() {
    let clock = ManualClock::new();
    let broker = broker_at(clock.clone());
    let limits = Limits::new()
        .rate(RateLimit::per_minute(10))
        .rate(RateLimit::per_minute(1000).unit(Unit::Tokens));
    broker.register_limit("llm", limits).unwrap();
    assert!(allowed(&broker, "llm", Cost::tokens(900)).await);
    // 200 tokens do not fit: the request limit must not be charged either.
    for _ in 0..20 {
        assert!(!allowed(&broker, "llm", Cost::tokens(200)).await);
    }
    for _ in 0..9 {
        assert!(allowed(&broker, "llm", Cost::tokens(10)).await);
    }
    let denied = broker.try_acquire("llm", Cost::tokens(0)).await.unwrap();
    assert!(
        !denied.allowed,
        "the 11th request is over the request limit"
    );
}

#[tokio::test]
async fn permit_holds_a_slot_until_released_and_release_is_idempotent() {
    let broker = broker_at(ManualClock::new());
    broker
        .register_limit("gw", Limits::new().max_concurrent(2))
        .unwrap();
    let mut a = broker.try_acquire("gw", Cost::default()).await.unwrap();
    let b = broker.try_acquire("gw", Cost::default()).await.unwrap();
    assert!(a.allowed && b.allowed && a.permit.is_held());
    let c = broker.try_acquire("gw", Cost::default()).await.unwrap();
    assert!(!c.allowed);
    assert_eq!(c.denied_by, Some(DenyReason::Concurrency));
    assert!(!c.permit.is_held(), "a denied acquisition holds nothing");
    assert_eq!(broker.stats().resources["gw"].in_flight, 2);

    a.permit.release();
    a.permit.release();
    assert_eq!(broker.stats().resources["gw"].in_flight, 1);
    let d = broker.try_acquire("gw", Cost::default()).await.unwrap();
    assert!(d.allowed);
    assert!(!allowed(&broker, "gw", Cost::default()).await);

    drop(b);
    drop(d);
    assert_eq!(broker.stats().resources["gw"].in_flight, 0);
    let e = broker.try_acquire("gw", Cost::default()).await.unwrap();
    let f = broker.try_acquire("gw", Cost::default()).await.unwrap();
    assert!(e.allowed && f.allowed, "dropped permits freed both slots");
}

/// A permit joined from two holds both slots and releases both together.
#[tokio::test]
async fn joined_permits_release_both_slots_together() {
    use broker_core::Permit;
    let broker = ResourceBroker::new(MemoryBackend::new());
    for id in ["a", "b"] {
        broker
            .register_limit(id, Limits::new().max_concurrent(1))
            .unwrap();
    }
    let take = |id: &'static str| {
        let broker = broker.clone();
        async move {
            let a = broker.try_acquire(id, Cost::default()).await.unwrap();
            (a.allowed, a.permit)
        }
    };
    let (_, a) = take("a").await;
    let (_, b) = take("b").await;
    let mut both = a.join(b).join(Permit::empty());
    assert!(both.is_held());
    assert!(!take("a").await.0 && !take("b").await.0, "both slots held");
    assert_eq!(broker.stats().resources["b"].in_flight, 1);
    both.release();
    assert!(!both.is_held());
    assert_eq!(broker.stats().resources["b"].in_flight, 0);
    assert!(take("a").await.0 && take("b").await.0, "both slots free");
    let (_, a) = take("a").await;
    let alone = Permit::empty().join(a);
    assert!(alone.is_held() && !take("a").await.0);
    drop(alone);
    assert!(take("a").await.0);
}

/// A batch registers every entry or none; an id taken with other limits,
/// or as a queue, refuses it; the same limits (a burst written out as the
/// amount it defaults to) keep the registration there, state and counters
/// too.
#[tokio::test]
async fn a_batch_registers_all_or_nothing_and_keeps_what_is_the_same() {
    use broker_core::{ConfigError, OnOtherLimits, ResourceConfig};
    let broker = ResourceBroker::new(MemoryBackend::new());
    let five = Limits::new().rate(RateLimit::per_second(5));
    let ten = Limits::new().rate(RateLimit::per_second(10));
    broker
        .register_limits(&[("a", &five)], OnOtherLimits::Refuse)
        .unwrap();
    assert!(allowed(&broker, "a", Cost::default()).await);
    let refused = broker
        .register_limits(&[("b", &five), ("a", &ten)], OnOtherLimits::Refuse)
        .unwrap_err();
    assert_eq!(refused.index, 1);
    assert!(
        matches!(refused.error, ConfigError::Taken { .. }),
        "{refused}"
    );
    assert!(broker.limits("b").is_err(), "none of the batch");
    let mut written_out = RateLimit::per_second(5);
    written_out.burst = Some(5);
    let same = Limits::new().rate(written_out);
    broker
        .register_limits(&[("a", &same), ("b", &five)], OnOtherLimits::Refuse)
        .unwrap();
    assert_eq!(
        broker.stats().resources["a"].allowed,
        1,
        "kept, not re-registered"
    );
    broker
        .register_limits(&[("a", &ten)], OnOtherLimits::Replace)
        .unwrap();
    assert_eq!(broker.limits("a").unwrap(), ten);
    broker
        .register("q", ResourceConfig::new(five.clone()))
        .unwrap();
    for on_other in [OnOtherLimits::Refuse, OnOtherLimits::Replace] {
        let e = broker
            .register_limits(&[("q", &five)], on_other)
            .unwrap_err();
        assert!(e.to_string().contains("queue"), "{e}");
        // An id named twice, a bad id or bad limits: the entry named,
        // nothing registered.
        let twice = broker.register_limits(&[("c", &five), ("c", &ten)], on_other);
        assert_eq!(twice.unwrap_err().index, 1);
        let bad_id = broker.register_limits(&[("c", &five), ("", &five)], on_other);
        assert_eq!(bad_id.unwrap_err().index, 1);
        let zero = Limits::new().rate(RateLimit::per(0, Duration::from_secs(1)));
        let bad = broker.register_limits(&[("c", &five), ("d", &zero)], on_other);
        assert_eq!(bad.unwrap_err().index, 1);
        assert!(broker.limits("c").is_err() && broker.limits("d").is_err());
    }
}

/// Two batches of other limits on the same ids at once: one is
/// registered, whole, and the other refused.
#[test]
fn of_two_batches_at_once_one_is_refused() {
    use broker_core::OnOtherLimits;
    let ids: Vec<String> = (0..200).map(|i| format!("r{i}")).collect();
    for _ in 0..50 {
        let broker = ResourceBroker::new(MemoryBackend::new());
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<_> = std::thread::scope(|s| {
            let batches = [1, 1000].map(|per_second| {
                let (broker, ids, barrier) = (&broker, &ids, &barrier);
                s.spawn(move || {
                    let limits = Limits::new().rate(RateLimit::per_second(per_second));
                    let entries: Vec<_> = ids.iter().map(|id| (id.as_str(), &limits)).collect();
                    barrier.wait();
                    broker
                        .register_limits(&entries, OnOtherLimits::Refuse)
                        .map(|_| per_second)
                })
            });
            batches.map(|b| b.join().unwrap()).into_iter().collect()
        });
        let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(won.len(), 1, "{results:?}");
        let limits = Limits::new().rate(RateLimit::per_second(*won[0]));
        assert!(ids.iter().all(|id| broker.limits(id).unwrap() == limits));
    }
}

#[tokio::test]
async fn sub_key_permits_hold_their_own_slot_and_free_it_when_released() {
    let broker = broker_at(ManualClock::new());
    broker
        .register_limit("gw", Limits::new().max_concurrent(1))
        .unwrap();
    let mut a = broker
        .try_acquire(("gw", "a"), Cost::default())
        .await
        .unwrap();
    let own = broker.try_acquire("gw", Cost::default()).await.unwrap();
    assert!(a.allowed && a.permit.is_held() && own.permit.is_held());
    assert!(!allowed(&broker, ("gw", "a"), Cost::default()).await);
    let b = broker
        .try_acquire(("gw", "b"), Cost::default())
        .await
        .unwrap();
    assert!(b.allowed, "each sub-key has its own slot");
    assert_eq!(broker.stats().resources["gw"].in_flight, 3);

    a.permit.release();
    a.permit.release();
    assert_eq!(broker.stats().resources["gw"].in_flight, 2);
    assert!(
        !allowed(&broker, "gw", Cost::default()).await,
        "the own slot is still held"
    );
    let again = broker
        .try_acquire(("gw", "a"), Cost::default())
        .await
        .unwrap();
    assert!(again.allowed, "the released slot of a is free again");
    drop((own, b, again));
    assert_eq!(broker.stats().resources["gw"].in_flight, 0);
    assert!(allowed(&broker, "gw", Cost::default()).await);
}

#[tokio::test]
async fn sub_keys_have_their_own_state_under_one_limit() {
    let broker = broker_at(ManualClock::new());
    broker
        .register_limit("tenant", Limits::new().rate(RateLimit::per_minute(1)))
        .unwrap();
    assert!(allowed(&broker, ("tenant", "a"), Cost::default()).await);
    assert!(!allowed(&broker, ("tenant", "a"), Cost::default()).await);
    assert!(allowed(&broker, ("tenant", "b"), Cost::default()).await);
    // A key that looks like another's escaped key does not reach it.
    assert!(allowed(&broker, ("tenant", "a:"), Cost::default()).await);
    assert!(allowed(&broker, "tenant", Cost::default()).await);
}

#[tokio::test]
async fn unknown_resource_and_impossible_cost_are_clear_errors() {
    let broker = broker_at(ManualClock::new());
    broker
        .register_limit("api", Limits::new().rate(RateLimit::per_second(5)))
        .unwrap();
    let err = broker
        .try_acquire("nope", Cost::default())
        .await
        .unwrap_err();
    assert_eq!(err, BrokerError::UnknownResource("nope".into()));
    let err = broker
        .try_acquire("api", Cost::requests(6))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        BrokerError::CostNeverFits {
            burst: 5,
            cost: 6,
            ..
        }
    ));
    assert!(err.to_string().contains("can never fit"), "{err}");
}

#[test]
fn bad_limits_are_rejected_with_the_field_named() {
    let broker = ResourceBroker::new(MemoryBackend::new());
    let cases = [
        (
            Limits::new().rate(RateLimit::per_second(0)),
            "rates[0].amount",
        ),
        (
            Limits::new().rate(RateLimit::per(1, Duration::ZERO)),
            "rates[0].period",
        ),
        (
            Limits::new().rate(RateLimit::per_second(1).with_burst(0)),
            "rates[0].burst",
        ),
        (Limits::new().max_concurrent(0), "maxConcurrent"),
    ];
    for (limits, field) in cases {
        let err = broker.register_limit("x", limits).unwrap_err();
        assert!(err.to_string().contains(field), "{err} should name {field}");
    }
    assert!(broker.register_limit("", Limits::new()).is_err());
    let unknown = serde_json::from_str::<Limits>(r#"{"requestsPerSecnd": 5}"#).unwrap_err();
    assert!(
        unknown.to_string().contains("requestsPerSecnd"),
        "{unknown}"
    );
    let negative = serde_json::from_str::<Limits>(r#"{"requestsPerSecond": -5}"#);
    assert!(negative.is_err());
    // Inside a rate too: a misspelt `burst` or `unit` is no silent default.
    for typo in [
        r#"{"rates": [{"amount": 100, "period": "1m", "brust": 5}]}"#,
        r#"{"rates": [{"amount": 100, "period": "1m", "units": "tokens"}]}"#,
    ] {
        let err = serde_json::from_str::<Limits>(typo).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{typo}: {err}");
    }
    // A shorthand says why it was refused, and an explicit rate is named
    // by the index its author wrote.
    let too_big = serde_json::from_str::<Limits>(r#"{"requestsPerSecond": 2199023255553}"#)
        .unwrap_err()
        .to_string();
    assert!(
        too_big.contains("requestsPerSecond") && !too_big.contains("greater than zero"),
        "{too_big}"
    );
    let shifted = serde_json::from_str::<Limits>(
        r#"{"requestsPerSecond": 10, "tokensPerMinute": 1000,
            "rates": [{"amount": 5, "period": "1s", "burst": 0}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(shifted.contains("rates[0].burst"), "{shifted}");
}

/// A lease TTL shorter than the µs the states count in would let every
/// lease expire at once: refused.
#[test]
fn a_lease_ttl_below_a_microsecond_is_refused() {
    let config = r#"{"limits": {"maxConcurrentRequests": 1}, "leaseTtl": "500ns"}"#;
    let err = serde_json::from_str::<broker_core::ResourceConfig>(config)
        .map_err(|e| e.to_string())
        .and_then(|c| c.validate().map_err(|e| e.to_string()))
        .unwrap_err();
    assert!(err.contains("leaseTtl"), "{err}");
}

/// A `maxHold` of zero would stop renewing every lease at once: refused,
/// naming the field; one given is read, and 1 h is the default.
#[test]
fn a_max_hold_of_zero_is_refused_and_one_given_is_read() {
    let read = |config: &str| {
        serde_json::from_str::<broker_core::ResourceConfig>(config).map_err(|e| e.to_string())
    };
    let err = read(r#"{"limits": {"maxConcurrentRequests": 1}, "maxHold": "0s"}"#).unwrap_err();
    assert!(err.contains("maxHold"), "{err}");
    let ten = read(r#"{"limits": {"maxConcurrentRequests": 1}, "maxHold": "10m"}"#).unwrap();
    assert_eq!(ten.max_hold, std::time::Duration::from_secs(600));
    let default = read(r#"{"limits": {"maxConcurrentRequests": 1}}"#).unwrap();
    assert_eq!(default.max_hold, std::time::Duration::from_secs(3600));
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_within_max_wait_and_denies_beyond_it_without_booking() {
    let broker = ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()));
    broker
        .register_limit(
            "api",
            Limits::new().rate(RateLimit::per_second(5).with_burst(1)),
        )
        .unwrap();
    let start = tokio::time::Instant::now();
    assert!(
        broker
            .acquire("api", Cost::default(), Duration::ZERO)
            .await
            .unwrap()
            .allowed
    );
    let second = broker
        .acquire("api", Cost::default(), Duration::from_millis(200))
        .await
        .unwrap();
    assert!(second.allowed);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    let third = broker
        .acquire("api", Cost::default(), Duration::from_millis(100))
        .await
        .unwrap();
    assert!(!third.allowed);
    assert_eq!(third.wait_time, Duration::from_millis(200));
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(200),
        "denied at once"
    );
    // Nothing was booked by the denial: the next slot is still 200 ms away.
    let fourth = broker
        .acquire("api", Cost::default(), Duration::from_millis(200))
        .await
        .unwrap();
    assert!(fourth.allowed);
    assert_eq!(start.elapsed(), Duration::from_millis(400));
}

#[tokio::test]
async fn stats_count_and_mark_limit_only_resources() {
    let broker = broker_at(ManualClock::new());
    broker
        .register_limit("hook", Limits::new().rate(RateLimit::per_second(1)))
        .unwrap();
    broker
        .register(
            "llm",
            broker_core::ResourceConfig::new(Limits::new().rate(RateLimit::per_second(1))),
        )
        .unwrap();
    let _ = broker.try_acquire("hook", Cost::default()).await.unwrap();
    let _ = broker.try_acquire("hook", Cost::default()).await.unwrap();
    let stats = broker.stats();
    assert_eq!(stats.resources["hook"].kind, ResourceKind::LimitOnly);
    assert_eq!(stats.resources["llm"].kind, ResourceKind::Queue);
    assert_eq!(
        (
            stats.resources["hook"].allowed,
            stats.resources["hook"].denied
        ),
        (1, 1)
    );
    let json = serde_json::to_value(&stats).unwrap();
    assert_eq!(json["resources"]["hook"]["kind"], "limit_only");
}

/// A call by id made as the thread exits, from a thread-local's destructor
/// that runs after the broker's per-thread cache of its registry is gone,
/// is answered from the registry itself, on the same state as every other
/// call: here the only token, taken earlier on that thread.
#[test]
fn a_call_made_as_the_thread_exits_is_answered_on_the_same_state() {
    use std::cell::RefCell;
    use std::sync::mpsc;

    struct CallOnExit(RefCell<Option<(ResourceBroker, mpsc::Sender<bool>)>>);
    impl Drop for CallOnExit {
        fn drop(&mut self) {
            if let Some((broker, answer)) = self.0.borrow_mut().take() {
                let a = broker.try_acquire_now("exit", Cost::default());
                let _ = answer.send(a.expect("in memory").expect("registered").allowed);
            }
        }
    }
    thread_local! {
        static CALL_ON_EXIT: CallOnExit = const { CallOnExit(RefCell::new(None)) };
    }

    let broker = broker_at(ManualClock::new());
    broker
        .register_limit("exit", Limits::new().rate(RateLimit::per_second(1)))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let on_thread = broker.clone();
    std::thread::spawn(move || {
        // Registered before the broker's cells, so destroyed after them
        // (thread-local destructors run in reverse order of registration).
        CALL_ON_EXIT.with(|c| *c.0.borrow_mut() = Some((on_thread.clone(), tx)));
        let first = on_thread.try_acquire_now("exit", Cost::default());
        assert!(first.unwrap().unwrap().allowed);
    })
    .join()
    .unwrap();
    assert!(
        !rx.recv().unwrap(),
        "the burst of 1 was taken by the first call"
    );
    let stats = broker.stats();
    let exit = stats.resources.get("exit").expect("registered");
    assert_eq!((exit.allowed, exit.denied), (1, 1));
}

/// `acquire` booked before a penalty is not allowed inside it: it waits
/// for the penalty's end within its `max_wait`, and is denied with the
/// wait beyond it.
#[tokio::test(start_paused = true)]
async fn acquire_waits_out_a_penalty_or_is_denied() {
    for (max_wait, allowed) in [(5, false), (15, true)] {
        let broker = ResourceBroker::new(MemoryBackend::with_clock(broker_core::TokioClock::new()));
        let limits = Limits::new().rate(RateLimit::per_second(1));
        broker.register_limit("api", limits).unwrap();
        let t0 = tokio::time::Instant::now();
        let first = broker.try_acquire("api", Cost::default()).await.unwrap();
        assert!(first.allowed);
        let b = broker.clone();
        let waiting = tokio::spawn(async move {
            let a = b
                .acquire("api", Cost::default(), Duration::from_secs(max_wait))
                .await
                .unwrap();
            (t0.elapsed(), a)
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        broker
            .penalize("api", Duration::from_secs(10))
            .await
            .unwrap();
        let (at, a) = waiting.await.unwrap();
        assert_eq!(a.allowed, allowed, "max_wait {max_wait} s: {a:?} at {at:?}");
        if allowed {
            assert!(
                at >= Duration::from_millis(10_500),
                "inside the penalty: {at:?}"
            );
        } else {
            assert!(a.wait_time >= Duration::from_secs(9), "{a:?}");
        }
    }
}

/// On the in-memory store a slot is held for as long as its permit lives,
/// however long past the resource's `lease_ttl` (60 s by default): its
/// holder cannot die apart from the store, and expiring it would let a
/// second holder in beside the first.
#[tokio::test]
async fn an_in_memory_permit_holds_its_slot_past_the_lease_ttl() {
    let clock = ManualClock::new();
    let broker = broker_at(clock.clone());
    broker
        .register_limit("r", Limits::new().max_concurrent(1))
        .unwrap();
    let first = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed);
    clock.advance(Duration::from_secs(3600));
    let second = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(!second.allowed, "a second holder beside the first");
    assert_eq!(second.denied_by, Some(DenyReason::Concurrency));
    drop(first);
    let third = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(third.allowed, "the slot is free once the permit is gone");
}

/// A `try_acquire` that a store needing I/O decides across a
/// re-registration of its resource (a config reload while the store
/// answers) is counted in the stats the broker reports, as what happens
/// to an `enqueue` or an `acquire` across one is. Before, its verdict went
/// to the replaced registration's counters, which `stats()` no longer
/// reports: the call was never counted.
#[tokio::test(start_paused = true)]
async fn a_decision_in_flight_across_a_re_registration_is_counted_in_the_new_stats() {
    struct Remote;
    impl broker_testkit::Hooks for Remote {
        fn asynchronous(&self) -> bool {
            true
        }
        fn local_states(
            &self,
            _: std::sync::Arc<dyn broker_core::LocalStates>,
        ) -> Option<std::sync::Arc<dyn broker_core::LocalStates>> {
            None
        }
        fn try_acquire_delay(&self, _: &str) -> Duration {
            Duration::from_millis(100)
        }
    }
    let store = std::sync::Arc::new(MemoryBackend::new());
    let broker = ResourceBroker::new(broker_testkit::Wrapped::new(store, Remote));
    let limits = Limits::new().rate(RateLimit::per_second(1));
    broker.register_limit("api", limits.clone()).unwrap();
    let b = broker.clone();
    let call = tokio::spawn(async move { allowed(&b, "api", Cost::default()).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    broker.register_limit("api", limits).unwrap();
    assert!(call.await.unwrap());
    assert!(!allowed(&broker, "api", Cost::default()).await);
    let stats = &broker.stats().resources["api"];
    assert_eq!((stats.allowed, stats.denied), (1, 1), "{stats:?}");
}
