//! Kill redis-server in the middle of a load, restart it: no panic, the
//! configured failure policy answers every call made while it is down, and
//! the same broker recovers on its own when Redis returns.

mod redis_support;
use redis_support::{every_call_a_probe, local_fallback, with_op_timeout, OP_TIMEOUT};

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::{BrokerError, Cost, Limits, ManualClock, RateLimit, ResourceBroker};
use broker_core::{Failover, FailurePolicy};
use broker_redis::RedisBackend;
use broker_testkit::{free_port, RedisServer};

/// A backend on `url` that gives up on a call after 300 ms and probes a
/// down server every 20 ms.
async fn quick(
    url: &str,
    prefix: &str,
    coalesce: bool,
    policy: FailurePolicy,
) -> Failover<RedisBackend> {
    RedisBackend::builder(url)
        .prefix(prefix)
        .coalesce(coalesce)
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_millis(20))
        .connect_with_policy(policy)
        .await
        .expect("connect")
}

const UP: u8 = 0;
const DOWN: u8 = 1;
const BACK: u8 = 2;
const MAX_CALLS: usize = 20_000;

/// One call of the load: the phase when it started and ended, and what it got.
struct Call {
    start: u8,
    end: u8,
    result: Result<bool, BrokerError>,
}

struct Outcome {
    /// Calls made entirely while the server was dead.
    down: Vec<Result<bool, BrokerError>>,
    /// Whether the call made once the broker read up again after the
    /// restart was answered by Redis.
    recovered: bool,
    outages: u64,
    handled_errors: u64,
}

async fn kill_mid_load(policy: FailurePolicy) -> Outcome {
    let mut server = RedisServer::start();
    let clock = ManualClock::new();
    // The local fallback on the same clock as the store.
    let policy = match policy {
        FailurePolicy::LocalFallback { share, .. } => FailurePolicy::local_fallback(
            share,
            broker_memory::MemoryBackend::with_clock(clock.clone()),
        ),
        other => other,
    };
    let backend = RedisBackend::builder(&server.url())
        .client_time(Arc::new(clock.clone()))
        .probe_interval(Duration::from_millis(20))
        .connect_with_policy(policy)
        .await
        .expect("connect");
    let backend = Arc::new(backend);
    let broker = ResourceBroker::from_arc(backend.clone());
    let limits = Limits::new().rate(RateLimit::per_second(10).with_burst(10));
    broker.register_limit("api", limits).unwrap();

    let phase = Arc::new(AtomicU8::new(UP));
    let load = {
        let (broker, phase) = (broker.clone(), phase.clone());
        tokio::spawn(async move {
            let mut calls = Vec::new();
            for _ in 0..MAX_CALLS {
                let start = phase.load(Ordering::SeqCst);
                // Read before the call: the probe may find Redis back while
                // a call is answered by the policy, and the call after the
                // broker reads up is the one that tells whether it recovered.
                let health = broker.stats().backend;
                let back = start == BACK && health.outages > 0 && !health.down;
                let result = broker
                    .try_acquire("api", Cost::default())
                    .await
                    .map(|a| a.allowed);
                let end = phase.load(Ordering::SeqCst);
                calls.push(Call { start, end, result });
                if back {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            calls
        })
    };

    tokio::time::sleep(Duration::from_millis(100)).await;
    server.kill();
    phase.store(DOWN, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    phase.store(BACK, Ordering::SeqCst);
    server.restart();

    let deadline = Instant::now() + Duration::from_secs(20);
    while !load.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(load.is_finished(), "the load ends once Redis is back");
    let calls = load.await.expect("the load task did not panic");
    let health = broker_core::Store::health(&*backend);
    assert_eq!(
        broker.stats().backend,
        health,
        "broker.stats() reports the store's health"
    );
    let last = calls.last().expect("calls were made");
    let recovered = !health.down && last.end == BACK && last.result.is_ok();
    Outcome {
        down: calls
            .into_iter()
            .filter(|c| c.start == DOWN && c.end == DOWN)
            .map(|c| c.result)
            .collect(),
        recovered,
        outages: health.outages,
        handled_errors: health.handled_errors,
    }
}

fn check_common(o: &Outcome) {
    eprintln!(
        "{} calls while down ({} allowed); {} handled by the policy, {} outage(s)",
        o.down.len(),
        o.down.iter().filter(|r| matches!(r, Ok(true))).count(),
        o.handled_errors,
        o.outages
    );
    assert!(
        !o.down.is_empty(),
        "calls were made while the server was dead"
    );
    assert!(o.recovered, "the broker recovered without a restart");
    assert_eq!(o.outages, 1, "one outage, logged once");
    assert!(o.handled_errors >= o.down.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_every_call_while_redis_is_down_then_recovers() {
    let o = kill_mid_load(FailurePolicy::FailClosed).await;
    check_common(&o);
    for r in &o.down {
        assert!(matches!(r, Err(BrokerError::Backend(_))), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_allows_every_call_while_redis_is_down_then_recovers() {
    let o = kill_mid_load(FailurePolicy::FailOpen).await;
    check_common(&o);
    for r in &o.down {
        assert!(matches!(r, Ok(true)), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fallback_allows_only_its_share_while_redis_is_down_then_recovers() {
    let o = kill_mid_load(local_fallback(0.5)).await;
    check_common(&o);
    let allowed = o.down.iter().filter(|r| matches!(r, Ok(true))).count();
    assert!(o.down.iter().all(|r| r.is_ok()), "no call fails");
    // Virtual time stands still: the local bucket holds half the burst of 10.
    assert!(allowed <= 5, "{allowed} allowed, more than half the burst");
    assert!(allowed >= 1, "the local share admits while Redis is down");
    assert!(
        o.down.len() <= 5 || allowed < o.down.len(),
        "denials once the share is spent"
    );
}

#[tokio::test]
async fn connecting_to_a_dead_server_fails_fast_with_a_clear_error() {
    for auth in ["", ":sekret@"] {
        let url = format!("redis://{auth}127.0.0.1:{}/", free_port());
        let err = RedisBackend::builder(&url)
            .connect_timeout(Duration::from_millis(200))
            .connect()
            .await
            .expect_err("nothing listens there");
        assert!(err.message.contains("connecting to redis"), "{err}");
        // A password in the url stays out of the error (it is logged).
        assert!(!err.message.contains("sekret"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_times_out_into_the_policy_instead_of_hanging_callers() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(&server.url())
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(20))
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new().rate(RateLimit::per_minute(1).with_burst(1));
    broker.register_limit("api", limits).unwrap();
    assert!(
        broker
            .try_acquire("api", Cost::default())
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !broker
            .try_acquire("api", Cost::default())
            .await
            .unwrap()
            .allowed
    );

    server.pause();
    for _ in 0..5 {
        let a = tokio::time::timeout(
            Duration::from_secs(10),
            broker.try_acquire("api", Cost::default()),
        )
        .await
        .expect("a call to a hung server returns")
        .expect("fail-open answers");
        assert!(a.allowed, "fail-open while the server does not answer");
    }
    let health = broker.stats().backend;
    assert!(health.down);
    assert_eq!(health.outages, 1);

    server.resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    while broker.stats().backend.down && Instant::now() < deadline {
        let _ = broker.try_acquire("api", Cost::default()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !broker.stats().backend.down,
        "recovered once the server answers"
    );
    let a = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(!a.allowed, "the shared bucket decides again: it is empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_backend_starts_while_redis_is_down_and_shares_decisions_once_it_is_up() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let backend = RedisBackend::builder(&url)
        .lazy_connect(true)
        .connect_timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_millis(20))
        .connect()
        .await
        .expect("a lazy connect does not talk to Redis");
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new().rate(RateLimit::per_minute(1).with_burst(3));
    broker.register_limit("api", limits.clone()).unwrap();

    // Down: the default fail-closed policy answers with a backend error.
    let err = broker
        .try_acquire("api", Cost::default())
        .await
        .expect_err("redis is down");
    assert!(matches!(err, BrokerError::Backend(_)), "{err:?}");

    // Up again on the same port: the same broker reaches it by itself.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match broker.try_acquire("api", Cost::default()).await {
            Ok(a) => break a,
            Err(e) if Instant::now() < deadline => {
                assert!(matches!(e, BrokerError::Backend(_)), "{e:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("redis is back but the broker still fails: {e}"),
        }
    };
    assert!(first.allowed);

    // The decision is in Redis: a broker connected the usual way shares
    // the bucket (burst 3, one token taken).
    let other = ResourceBroker::new(RedisBackend::connect(&url).await.expect("connect"));
    other.register_limit("api", limits).unwrap();
    let mut allowed = 0;
    for b in [&other, &broker, &other] {
        allowed += b.try_acquire("api", Cost::default()).await.unwrap().allowed as u32;
    }
    assert_eq!(allowed, 2, "one bucket of 3 across both brokers");
}

#[tokio::test]
async fn lazy_connect_is_refused_for_a_cluster_and_checks_the_url() {
    let err = RedisBackend::builder("redis://127.0.0.1:1/")
        .cluster(vec!["redis://127.0.0.1:1/".to_owned()])
        .lazy_connect(true)
        .connect()
        .await
        .expect_err("cluster");
    assert!(err.message.contains("lazy_connect"), "{err}");
    let err = RedisBackend::builder("not a url")
        .lazy_connect(true)
        .connect()
        .await
        .expect_err("bad url");
    assert!(err.message.contains("redis url"), "{err}");
}

/// A concurrency decision that times out while Redis hangs (its caller is
/// told it failed), or whose caller goes away before the reply, may still
/// be granted once Redis runs its script: that lease is released, so the
/// slot is free again soon after Redis answers, not after the lease's TTL
/// (60 s here). With coalescing on and off, and with every call through
/// the shared connection (a RESP3 URL: its own timeout answers first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_or_dropped_decision_does_not_keep_its_slot() {
    let server = RedisServer::start();
    let urls = [server.url(), format!("{}?protocol=resp3", server.url())];
    for (coalesce, url) in [true, false]
        .into_iter()
        .flat_map(|c| urls.iter().map(move |u| (c, u)))
    {
        let prefix = format!("slot{coalesce}{}", url.len());
        let backend = Arc::new(quick(url, &prefix, coalesce, FailurePolicy::FailClosed).await);
        let broker = ResourceBroker::from_arc(backend.clone());
        broker
            .register_limit("api", Limits::new().max_concurrent(1))
            .unwrap();
        let take = || async {
            broker
                .try_acquire("api", Cost::default())
                .await
                .map(|a| a.allowed)
        };
        // Free once its permit is dropped (released by a task of its own).
        let free_again = || async {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(true) = take().await {
                    return true;
                }
                if Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        // The release of the permit `free_again` took (sent by a task of
        // its own) has landed: none is in flight when the server pauses.
        let released = || async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let state = backend.primary().state("api").await.unwrap();
                if state.is_none_or(|s| s.leases.is_empty()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("coalesce {coalesce}: a released permit's lease is still held");
        };
        assert!(
            free_again().await,
            "coalesce {coalesce}: the slot is free at first"
        );
        released().await;

        // Timed out: the caller gets the failure policy's answer (closed).
        server.pause();
        let timed_out = take().await;
        assert!(
            !matches!(timed_out, Ok(true)),
            "coalesce {coalesce}: no slot while Redis hangs"
        );
        server.resume();
        assert!(
            free_again().await,
            "coalesce {coalesce}: the slot is free again after a timeout"
        );
        released().await;

        // Dropped: the caller goes away while the decision is in flight.
        server.pause();
        let dropped = tokio::time::timeout(Duration::from_millis(100), take()).await;
        assert!(dropped.is_err(), "coalesce {coalesce}: still in flight");
        server.resume();
        assert!(
            free_again().await,
            "coalesce {coalesce}: the slot is free again after a dropped call"
        );
    }
}

/// A primary that refuses writes (`min-replicas-to-write` with no replica:
/// `NOREPLICAS`) is unavailable to the failure policy, as a down one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_refuses_writes_is_answered_by_the_failure_policy() {
    let server = RedisServer::start_with(&["--min-replicas-to-write", "1"]);
    let backend = quick(&server.url(), "rb", true, FailurePolicy::FailOpen).await;
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new().rate(RateLimit::per_minute(1).with_burst(1));
    broker.register_limit("api", limits).unwrap();
    for _ in 0..3 {
        let a = broker.try_acquire("api", Cost::default()).await;
        assert!(a.is_ok_and(|a| a.allowed), "fail-open answers");
    }
    assert!(broker.stats().backend.down);
}

/// A server busy with a long script (another client's, past
/// `busy-reply-threshold`) refuses every other command with `BUSY` until
/// the script ends: it cannot serve now, so the failure policy answers, as
/// it does for a server that is loading or refuses writes, with an outage
/// recorded; once the script is killed, Redis decides again. Before, each
/// call failed with the `BUSY` error whatever the policy (fail-open too),
/// and the backend was counted up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_busy_with_a_long_script_is_answered_by_the_failure_policy() {
    use std::io::Write;
    let server = RedisServer::start_with(&["--busy-reply-threshold", "10"]);
    for coalesce in [true, false] {
        let prefix = format!("busy{coalesce}");
        let backend = quick(&server.url(), &prefix, coalesce, FailurePolicy::FailOpen).await;
        let broker = ResourceBroker::new(backend);
        let limits = Limits::new().rate(RateLimit::per_minute(1).with_burst(1));
        broker.register_limit("api", limits).unwrap();
        let first = broker.try_acquire("api", Cost::default()).await.unwrap();
        assert!(first.allowed, "coalesce {coalesce}");
        // Another client's script that runs until it is killed.
        let mut busy = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        busy.write_all(b"EVAL \"while true do end\" 0\r\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !server.command("PING").starts_with("-BUSY") {
            assert!(
                Instant::now() < deadline,
                "the script never blocked the server"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let a = broker.try_acquire("api", Cost::default()).await;
        assert!(
            a.as_ref().is_ok_and(|a| a.allowed),
            "coalesce {coalesce}: fail-open answers a busy server: {a:?}"
        );
        assert!(broker.stats().backend.down, "coalesce {coalesce}");
        assert!(server.command("SCRIPT KILL").starts_with("+OK"));
        drop(busy);
        let deadline = Instant::now() + Duration::from_secs(10);
        while broker.stats().backend.down {
            assert!(Instant::now() < deadline, "coalesce {coalesce}: never back");
            let _ = broker.try_acquire("api", Cost::default()).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let a = broker.try_acquire("api", Cost::default()).await.unwrap();
        assert!(
            !a.allowed,
            "coalesce {coalesce}: Redis decides again: empty"
        );
    }
}

/// A server that closes idle connections (`timeout 1`, as a proxy's idle
/// timeout would): a call after an idle gap goes through on a fresh
/// connection, with no outage recorded and no call answered by the
/// failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_while_idle_are_replaced_without_an_outage() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    for coalesce in [true, false] {
        let prefix = format!("idle{coalesce}");
        let backend = quick(&server.url(), &prefix, coalesce, FailurePolicy::FailClosed).await;
        let broker = ResourceBroker::new(backend);
        let limits = Limits::new().rate(RateLimit::per_second(1000));
        broker.register_limit("api", limits).unwrap();
        for _ in 0..2 {
            // Two at once, after the connection was idle past the
            // server's timeout.
            let (a, b) = tokio::join!(
                broker.try_acquire("api", Cost::default()),
                broker.try_acquire("api", Cost::default())
            );
            assert!(
                a.as_ref().is_ok_and(|a| a.allowed),
                "coalesce {coalesce}: {a:?}"
            );
            assert!(
                b.as_ref().is_ok_and(|b| b.allowed),
                "coalesce {coalesce}: {b:?}"
            );
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
        let health = broker.stats().backend;
        assert_eq!(health.outages, 0, "coalesce {coalesce}: {health:?}");
    }
}

/// `book_at` on the store while the server is down is an
/// "unavailable" error, which the failure policy above the store answers:
/// its `book` books, marked as answered here. (Before the policy moved
/// above the store, `book_at` itself answered with this process's time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn book_at_while_down_is_unavailable_and_the_policy_answers_book() {
    use broker_core::Store;
    let mut server = RedisServer::start();
    let backend = quick(&server.url(), "rb", true, FailurePolicy::FailOpen).await;
    server.kill();
    let spec = broker_core::LimitSpec::new(
        &Limits::new().rate(RateLimit::per_second(1)),
        Duration::from_secs(60),
    );
    let err = backend
        .primary()
        .book_at("k", &spec, Cost::default(), Duration::from_secs(1))
        .await
        .expect_err("redis is down");
    assert!(err.is_unavailable(), "{err}");
    let booked = backend
        .book("k", &spec, Cost::default(), Duration::from_secs(1))
        .await
        .expect("fail-open answers");
    assert!(booked.booked);
    assert_eq!(booked.since, broker_core::Marks::ANSWERED_HERE);
}

/// A broker on `server` under the local fallback (a share of 1: one
/// replica), with resource `r` of one slot and a lease TTL of 300 ms.
async fn one_slot_under_local_fallback(server: &RedisServer, prefix: &str) -> ResourceBroker {
    let backend = quick(&server.url(), prefix, true, local_fallback(1.0)).await;
    let broker = ResourceBroker::new(backend);
    let mut config = broker_core::ResourceConfig::new(Limits::new().max_concurrent(1));
    config.lease_ttl = Duration::from_millis(300);
    broker.register("r", config).unwrap();
    broker
}

/// A lease the local fallback granted while Redis was down is renewed
/// where it is held: a permit kept past the lease TTL keeps its slot, and
/// no second holder gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_fallback_permit_keeps_its_slot_past_the_lease_ttl() {
    let mut server = RedisServer::start();
    let broker = one_slot_under_local_fallback(&server, "fallback-lease").await;
    let free = |broker: &ResourceBroker| {
        let broker = broker.clone();
        async move {
            broker
                .try_acquire("r", Cost::default())
                .await
                .unwrap()
                .allowed
        }
    };
    assert!(free(&broker).await, "one slot, free (released at once)");
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.kill();
    let first = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed, "granted by the local fallback");
    assert!(!free(&broker).await, "held locally");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !free(&broker).await,
        "the fallback's lease is renewed past its TTL"
    );
    server.restart();
    drop(first);
}

/// How many calls of 100 tokens `broker` gets on `api` now, one after
/// another.
async fn drained_by_hundreds(broker: &ResourceBroker) -> usize {
    let mut n = 0;
    while n < 100
        && broker
            .try_acquire("api", Cost::tokens(100))
            .await
            .unwrap()
            .allowed
    {
        n += 1;
    }
    n
}

/// Waits until `broker`'s backend sees Redis up again.
async fn until_up(broker: &ResourceBroker) {
    for _ in 0..400 {
        let _ = broker.try_acquire("probe", Cost::default()).await;
        if !broker.stats().backend.down {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("Redis never came back");
}

/// A booking made while Redis was down (by the local fallback, or let
/// through open) is settled after Redis is back: its unused cost is not
/// given to Redis, which never charged it, also when the resource was
/// re-registered meanwhile with other limits on the same buckets. Replica
/// `a` (fail-closed) drains the shared 1,000 tokens a minute once Redis is
/// back; replica `b`'s work, booked at 500 tokens during the outage, then
/// reports 10 used. The calls `a` gets after that settlement.
async fn calls_after_a_settlement_of_an_outage(policy: FailurePolicy, reregister: bool) -> usize {
    let mut server = RedisServer::start();
    let a = ResourceBroker::new(quick(&server.url(), "rb", true, FailurePolicy::FailClosed).await);
    let b = ResourceBroker::new(quick(&server.url(), "rb", true, policy.clone()).await);
    let tokens = Limits::new().rate(RateLimit::per_minute(1000).unit(broker_core::Unit::Tokens));
    for broker in [&a, &b] {
        broker
            .register("api", broker_core::ResourceConfig::new(tokens.clone()))
            .unwrap();
        broker
            .register_limit("probe", Limits::new().rate(RateLimit::per_second(1000)))
            .unwrap();
    }
    server.kill();
    let (started, has_started) = tokio::sync::oneshot::channel();
    let (go, goes) = tokio::sync::oneshot::channel::<()>();
    let on_b = b.clone();
    let job = tokio::spawn(async move {
        let (mut started, mut goes) = (Some(started), Some(goes));
        on_b.enqueue("api", Cost::tokens(500), move |_| {
            let (started, goes) = (started.take(), goes.take());
            async move {
                started.unwrap().send(()).unwrap();
                goes.unwrap().await.unwrap();
                broker_core::Outcome::<(), ()>::ok_with_usage((), Cost::tokens(10))
            }
        })
        .await
    });
    has_started.await.unwrap();
    if reregister {
        // The same buckets, other limits (the lease TTL alone).
        let mut config = broker_core::ResourceConfig::new(tokens);
        config.lease_ttl = Duration::from_secs(61);
        b.register("api", config).unwrap();
    }
    server.restart();
    until_up(&b).await;
    until_up(&a).await;
    assert_eq!(
        drained_by_hundreds(&a).await,
        10,
        "{policy:?}: the whole burst"
    );
    go.send(()).unwrap();
    job.await.unwrap().unwrap();
    drained_by_hundreds(&a).await
}

/// [`calls_after_a_settlement_of_an_outage`] under each policy that
/// answers during an outage: `a` gets no call more.
async fn redis_gains_no_tokens_from_an_outage(reregister: bool) {
    for policy in [local_fallback(0.5), FailurePolicy::FailOpen] {
        let more = calls_after_a_settlement_of_an_outage(policy.clone(), reregister).await;
        assert_eq!(more, 0, "{policy:?}: Redis gained tokens it never lost");
    }
}

/// Before, Redis gained the 490 tokens: `a` got 4 more calls of 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_answered_during_an_outage_is_not_refunded_to_redis() {
    redis_gains_no_tokens_from_an_outage(false).await;
}

/// The same with a re-registration during the outage: the booking's
/// marks say where it was answered whatever the limits are now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nor_after_a_re_registration() {
    redis_gains_no_tokens_from_an_outage(true).await;
}

/// A slot taken by a call of a replaced registration, under the latest
/// limits' lease TTL (shorter), is renewed on that TTL: no second holder
/// gets it while the work runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_taken_under_new_limits_is_renewed_on_their_ttl() {
    let server = RedisServer::start();
    let broker =
        ResourceBroker::new(quick(&server.url(), "keep", true, FailurePolicy::FailClosed).await);
    let limits = Limits::new()
        .rate(RateLimit::per(1, Duration::from_secs(1)))
        .max_concurrent(1);
    let config = |ttl| {
        let mut config = broker_core::ResourceConfig::new(limits.clone());
        config.lease_ttl = ttl;
        config
    };
    broker
        .register("r", config(Duration::from_secs(30)))
        .unwrap();
    // The rate's one token: the call below waits a second for its booking.
    drop(broker.try_acquire("r", Cost::default()).await.unwrap());
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (started, has_started) = tokio::sync::oneshot::channel();
    let (on, counted) = (broker.clone(), running.clone());
    let job = tokio::spawn(async move {
        let mut started = Some(started);
        on.enqueue("r", Cost::default(), move |_| {
            let (started, counted) = (started.take(), counted.clone());
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                started.unwrap().send(()).unwrap();
                tokio::time::sleep(Duration::from_millis(2500)).await;
                counted.fetch_sub(1, Ordering::SeqCst);
                broker_core::Outcome::<(), ()>::ok(())
            }
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    broker
        .register("r", config(Duration::from_millis(300)))
        .unwrap();
    has_started.await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let second = broker.try_acquire("r", Cost::default()).await.unwrap();
    let both = second.allowed && running.load(Ordering::SeqCst) == 1;
    drop(second);
    job.await.unwrap().unwrap();
    assert!(!both, "two holders under max_concurrent 1");
}

/// A booking Redis charged, settled while Redis is down under the local
/// fallback: its unused cost is not given to the fallback's bucket, which
/// never took it (the local share would then hand out the full burst),
/// and a use beyond the booking is charged there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_booking_settled_during_an_outage_gives_the_fallback_nothing() {
    use broker_core::{LimitSpec, Store};

    let mut server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let backend = RedisBackend::builder(&server.url())
        .client_time(Arc::new(clock.clone()))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_secs(3600))
        .connect_with_policy(FailurePolicy::local_fallback(
            0.5,
            broker_memory::MemoryBackend::with_clock(clock.clone()),
        ))
        .await
        .expect("connect");
    let spec = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(10).with_burst(10)),
        Duration::from_secs(60),
    );
    let allowed_now = |key: &'static str| {
        let (backend, spec) = (backend.clone(), spec.clone());
        async move {
            let mut n = 0;
            while n < 100
                && backend
                    .try_acquire(key, &spec, Cost::requests(1))
                    .await
                    .unwrap()
                    .allowed
            {
                n += 1;
            }
            n
        }
    };
    // Booked in Redis before the outage.
    let mut bookings = Vec::new();
    for key in ["unused", "overused"] {
        let booking = backend
            .book(key, &spec, Cost::requests(5), Duration::ZERO)
            .await
            .unwrap();
        assert!(booking.booked && booking.wait == 0);
        bookings.push(booking);
    }
    server.kill();
    let settle = |key: &'static str, used: u64, since| {
        let (backend, spec) = (backend.clone(), spec.clone());
        async move {
            backend
                .settle(
                    key,
                    &spec,
                    Cost::requests(5),
                    Cost::requests(used),
                    Some(since),
                )
                .await
                .unwrap()
        }
    };
    // The work used nothing: the local share (5 of burst 10) stays 5.
    assert_eq!(allowed_now("unused").await, 5);
    settle("unused", 0, bookings[0].since).await;
    assert_eq!(
        allowed_now("unused").await,
        0,
        "no refund into the fallback"
    );
    // The work used 7 of 5: the 2 more are charged to the local share.
    settle("overused", 7, bookings[1].since).await;
    assert_eq!(allowed_now("overused").await, 3);
}

/// `acquire` says where its cost went as `try_acquire` does: a booking a
/// failure policy answered while Redis was down is marked so (before, an
/// `acquire` always said Redis had it, and its settlement went there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_says_where_its_cost_went() {
    for policy in [local_fallback(0.5), FailurePolicy::FailOpen] {
        let mut server = RedisServer::start();
        let b = ResourceBroker::new(quick(&server.url(), "rb", true, policy.clone()).await);
        let tokens =
            Limits::new().rate(RateLimit::per_minute(1000).unit(broker_core::Unit::Tokens));
        b.register_limit("api", tokens).unwrap();
        let up = b
            .acquire("api", Cost::tokens(100), Duration::ZERO)
            .await
            .unwrap();
        assert!(up.allowed && !up.answered_here, "{policy:?}");
        server.kill();
        let down = b
            .acquire("api", Cost::tokens(100), Duration::ZERO)
            .await
            .unwrap();
        assert!(down.allowed && down.answered_here, "{policy:?}");
        assert_eq!(down.settle_marks(), Some(broker_core::Marks::ANSWERED_HERE));
    }
}

/// An acquisition says where its cost went: one a failure policy answered
/// while Redis was down is marked so (`settle_marks`), and its settlement
/// once Redis is back gives Redis nothing (Redis never charged it), while
/// one Redis answered is settled in Redis. Before, `try_acquire` told
/// neither apart, and its caller could only read the store's health after
/// the call, which another call may have changed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_says_where_its_cost_went() {
    for policy in [local_fallback(0.5), FailurePolicy::FailOpen] {
        let mut server = RedisServer::start();
        let a =
            ResourceBroker::new(quick(&server.url(), "rb", true, FailurePolicy::FailClosed).await);
        let b = ResourceBroker::new(quick(&server.url(), "rb", true, policy.clone()).await);
        let tokens =
            Limits::new().rate(RateLimit::per_minute(1000).unit(broker_core::Unit::Tokens));
        for broker in [&a, &b] {
            broker.register_limit("api", tokens.clone()).unwrap();
            broker
                .register_limit("probe", Limits::new().rate(RateLimit::per_second(1000)))
                .unwrap();
        }
        server.kill();
        let down = b.try_acquire("api", Cost::tokens(400)).await.unwrap();
        assert!(down.allowed && down.answered_here, "{policy:?}");
        assert_eq!(down.settle_marks(), Some(broker_core::Marks::ANSWERED_HERE));
        server.restart();
        until_up(&b).await;
        until_up(&a).await;
        let up = b.try_acquire("api", Cost::tokens(100)).await.unwrap();
        assert!(up.allowed && !up.answered_here, "{policy:?}");
        assert_eq!(up.settle_marks(), None);
        assert_eq!(drained_by_hundreds(&a).await, 9, "{policy:?}");
        b.settle(
            "api",
            Cost::tokens(400),
            Cost::tokens(10),
            down.settle_marks(),
        )
        .await
        .unwrap();
        assert_eq!(
            drained_by_hundreds(&a).await,
            0,
            "{policy:?}: Redis gained tokens it never lost"
        );
        b.settle("api", Cost::tokens(100), Cost::tokens(0), up.settle_marks())
            .await
            .unwrap();
        assert_eq!(
            drained_by_hundreds(&a).await,
            1,
            "{policy:?}: the refund of Redis's answer goes to Redis"
        );
    }
}

/// A TCP proxy to Redis on `upstream` (as a load balancer or a Redis proxy
/// in front of a server): it passes bytes both ways, but once `cut` is
/// set, the next command it forwards gets no reply: when Redis's reply
/// comes, the proxy closes the client's connection instead (a proxy
/// restarting, a connection reset after the command went through).
async fn cutting_proxy(upstream: u16, cut: Arc<std::sync::atomic::AtomicBool>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    redis_support::proxy(upstream, move |client, server| {
        let cut = cut.clone();
        async move {
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let (mut up, mut down) = (vec![0u8; 65536], vec![0u8; 65536]);
            let mut doomed = false;
            loop {
                tokio::select! {
                    n = cr.read(&mut up) => match n {
                        Ok(n) if n > 0 => {
                            doomed |= cut.swap(false, Ordering::SeqCst);
                            if sw.write_all(&up[..n]).await.is_err() { return; }
                        }
                        _ => return,
                    },
                    n = sr.read(&mut down) => match n {
                        // Redis ran the command and replied: the
                        // client never sees the reply.
                        Ok(_) if doomed => return,
                        Ok(n) if n > 0 => {
                            if cw.write_all(&down[..n]).await.is_err() { return; }
                        }
                        _ => return,
                    },
                }
            }
        }
    })
    .await
}

/// A settlement that Redis ran, whose reply was lost with its connection
/// (closed under it before the reply came): the refund is made once. The
/// shared connection reports such a loss as a broken pipe, as it reports
/// a command never written on a connection closed while idle; sending it
/// again gave the refund twice, and the bucket more than the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_whose_reply_was_lost_is_not_applied_twice() {
    use broker_core::Store;
    let server = RedisServer::start();
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = cutting_proxy(server.port(), cut.clone()).await;
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    // RESP3: every call through the shared connection.
    let backend = RedisBackend::builder(&format!("redis://127.0.0.1:{port}/?protocol=resp3"))
        .client_time(Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect through the proxy");
    let limits = Limits::new().rate(RateLimit::per(10, Duration::from_secs(3600)).with_burst(10));
    let spec = broker_core::LimitSpec::new(&limits, Duration::from_secs(60));
    let key = "settled";
    let all = backend
        .try_acquire(key, &spec, Cost::requests(10))
        .await
        .unwrap();
    assert!(all.allowed);
    let drained = backend.state(key).await.unwrap().expect("a state");
    assert_eq!(drained.buckets[0].tokens, 0.0);
    // Loads the settle script, changes nothing.
    backend
        .settle(key, &spec, Cost::requests(1), Cost::requests(1), None)
        .await
        .unwrap();
    cut.store(true, Ordering::SeqCst);
    // Whatever the caller is told (the reply never came), Redis ran it.
    let _ = backend
        .settle(key, &spec, Cost::requests(3), Cost::requests(0), None)
        .await;
    assert!(!backend.health().down, "a lost reply is not an outage");
    let state = backend.state(key).await.unwrap().expect("a state");
    assert_eq!(state.buckets[0].tokens, 3.0, "the refund of 3, once");
}

/// A concurrency decision that Redis ran and granted, whose reply was lost
/// with its connection: the shared connection sends it again (a broken
/// pipe), and the second run finds the slot taken by the first run's
/// lease. The caller must hold that lease or be told of no slot that is
/// still taken: denied while its own lease held the last slot, the slot
/// stayed taken until the lease's TTL (60 s here), by no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_sent_again_after_its_reply_was_lost_keeps_no_slot_it_was_not_given() {
    use broker_core::Store;
    let server = RedisServer::start();
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = cutting_proxy(server.port(), cut.clone()).await;
    // RESP3: every call through the shared connection.
    let url = format!("redis://127.0.0.1:{port}/?protocol=resp3");
    for (coalesce, rate) in [(true, false), (false, false), (true, true)] {
        let prefix = format!("again{coalesce}{rate}");
        let backend = RedisBackend::builder(&url)
            .prefix(&prefix)
            .coalesce(coalesce)
            .client_time(Arc::new(ManualClock::new()))
            .connect()
            .await
            .expect("connect through the proxy");
        // With `rate`, the second run is refused by the rate limit first
        // (a burst of one, taken by the first run).
        let burst = if rate { 1 } else { 1000 };
        let limits = Limits::new()
            .rate(RateLimit::per(1, Duration::from_secs(3600)).with_burst(burst))
            .max_concurrent(1);
        let spec = broker_core::LimitSpec::new(&limits, Duration::from_secs(60));
        // Loads the script.
        let warm = backend
            .try_acquire("warm", &spec, Cost::default())
            .await
            .unwrap();
        assert!(warm.allowed);
        cut.store(true, Ordering::SeqCst);
        let decision = backend.try_acquire("api", &spec, Cost::default()).await;
        let held = server.command(&format!("ZCARD {prefix}:{{api}}:l"));
        match decision {
            Ok(d) if d.allowed => {
                assert!(d.lease.is_some());
                assert_eq!(held, ":1");
            }
            other => assert_eq!(
                held, ":0",
                "coalesce {coalesce}, rate {rate}: told {other:?}, yet a lease holds the slot"
            ),
        }
        // The same for `take_slot` (loaded first).
        let _ = backend.take_slot("loaded", &spec).await.unwrap();
        cut.store(true, Ordering::SeqCst);
        let slot = backend.take_slot("slot", &spec).await;
        let held = server.command(&format!("ZCARD {prefix}:{{slot}}:l"));
        match slot {
            Ok(Some(_)) => assert_eq!(held, ":1"),
            other => assert_eq!(
                held, ":0",
                "take_slot told {other:?}, yet a lease holds the slot"
            ),
        }
    }
}

/// The tokens of `api` as stored, once the refund of a call dropped in
/// flight has had time to land (at most 10 s): `None` when the state is
/// fresh (a full bucket).
async fn tokens_settled(backend: &RedisBackend, full: f64) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tokens = backend
            .state("api")
            .await
            .unwrap()
            .and_then(|s| s.buckets.first().map(|b| b.tokens));
        if tokens.is_none_or(|t| t >= full) || Instant::now() > deadline {
            return tokens;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A call dropped while its decision is in flight (its caller's timeout
/// fired while Redis was slow to answer): Redis still runs the decision
/// once it answers, and the cost it took is given back, as a dropped
/// `enqueue`'s unused booking is: no work went out for it. Before, a
/// `try_acquire`, an `acquire` or an `enqueue` dropped there left its cost
/// taken (a 2-per-minute limit lost one call of its two for 30 s), with
/// coalescing on and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_while_its_decision_is_in_flight_is_not_charged() {
    use broker_core::{Outcome, ResourceConfig};
    let server = RedisServer::start();
    for coalesce in [true, false] {
        for call in ["try_acquire", "acquire", "enqueue"] {
            let prefix = format!("inflight{coalesce}{call}");
            let backend =
                Arc::new(quick(&server.url(), &prefix, coalesce, FailurePolicy::FailClosed).await);
            let broker = ResourceBroker::from_arc(backend.clone());
            let limits = Limits::new().rate(RateLimit::per_minute(2));
            broker.register("api", ResourceConfig::new(limits)).unwrap();
            // Loads the scripts, takes nothing.
            let warm = broker.try_acquire("api", Cost::requests(0)).await.unwrap();
            assert!(warm.allowed);
            let none = Cost::requests(0);
            let warm = broker.acquire("api", none, Duration::ZERO).await.unwrap();
            assert!(warm.allowed);
            broker
                .settle("api", Cost::requests(0), Cost::requests(0), None)
                .await
                .unwrap();
            server.pause();
            let limit = Duration::from_millis(100);
            let dropped = match call {
                "try_acquire" => {
                    tokio::time::timeout(limit, async {
                        drop(broker.try_acquire("api", Cost::default()).await);
                    })
                    .await
                }
                "acquire" => {
                    tokio::time::timeout(limit, async {
                        let a = broker.acquire("api", Cost::default(), Duration::from_secs(5));
                        drop(a.await);
                    })
                    .await
                }
                _ => {
                    tokio::time::timeout(limit, async {
                        let work = |_| async { Outcome::<(), ()>::ok(()) };
                        drop(broker.enqueue("api", Cost::default(), work).await);
                    })
                    .await
                }
            };
            assert!(
                dropped.is_err(),
                "{call}, coalesce {coalesce}: still in flight"
            );
            server.resume();
            let tokens = tokens_settled(backend.primary(), 1.99).await;
            assert!(
                tokens.is_none_or(|t| t >= 1.99),
                "{call}, coalesce {coalesce}: the dropped call kept its cost: {tokens:?} tokens left"
            );
        }
    }
}

/// A backend on `server` under `policy` whose calls time out after
/// 150 ms: its decisions go one by one (`"alone"`), each through the batch
/// script (`"batch"`), or uncoalesced (`"off"`).
async fn timing_out(
    server: &RedisServer,
    prefix: String,
    mode: &str,
    policy: FailurePolicy,
) -> Failover<RedisBackend> {
    let mut builder = RedisBackend::builder(&server.url())
        .prefix(prefix)
        .coalesce(mode != "off")
        .connect_timeout(Duration::from_millis(150))
        .response_timeout(Duration::from_millis(150))
        .probe_interval(Duration::from_millis(20));
    if mode == "batch" {
        builder = builder.coalesce_every_call();
    }
    builder.connect_with_policy(policy).await.expect("connect")
}

/// A decision that gets no reply within the operation timeout (Redis
/// hangs) is answered by the failure policy: refused (fail-closed), or
/// counted in this process's share (local fallback). Redis runs it once it
/// answers again: what it took there is given back, for a `try` and a
/// `book`, alone, in a batch and with coalescing off. Before, Redis
/// kept the cost of a call that was refused or counted here (a
/// 2-per-minute limit lost one of its two calls for 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_answered_by_the_policy_on_a_timeout_costs_redis_nothing() {
    use broker_core::{LimitSpec, Store};
    let server = RedisServer::start();
    let spec = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(2)),
        Duration::from_secs(60),
    );
    for policy in [FailurePolicy::FailClosed, local_fallback(0.5)] {
        for mode in ["alone", "batch", "off"] {
            for call in ["try", "book"] {
                let prefix = format!("late{}{mode}{call}", policy.name());
                let backend = timing_out(&server, prefix, mode, policy.clone()).await;
                // Loads the scripts, takes nothing.
                let none = Cost::requests(0);
                assert!(
                    backend
                        .try_acquire("api", &spec, none)
                        .await
                        .unwrap()
                        .allowed
                );
                let warm = backend.book("api", &spec, none, Duration::ZERO);
                assert!(warm.await.unwrap().booked);
                backend
                    .settle("api", &spec, none, none, None)
                    .await
                    .unwrap();

                server.pause();
                let told = match call {
                    "try" => backend
                        .try_acquire("api", &spec, Cost::default())
                        .await
                        .map(|d| d.allowed),
                    _ => backend
                        .book("api", &spec, Cost::default(), Duration::from_secs(5))
                        .await
                        .map(|r| r.booked),
                };
                assert!(
                    backend.health().down,
                    "{policy:?} {mode} {call}: answered by the policy ({told:?})"
                );
                server.resume();
                let tokens = tokens_settled(backend.primary(), 1.99).await;
                assert!(
                    tokens.is_none_or(|t| t >= 1.99),
                    "{policy:?} {mode} {call}: told {told:?}, yet Redis kept the cost: {tokens:?} tokens left"
                );
            }
        }
    }
}

/// A limit too small for the local fallback to split by its share (1 a
/// minute at a share of 0.5: a bucket of half a token; one slot: none)
/// admits nothing locally while Redis is down, and says so with an error.
/// Before, `try_acquire` was denied with a wait of about a minute that
/// never came true (the bucket never holds a whole token), so a caller
/// that honoured it retried forever, and `book` booked the call after
/// that wait: two replicas at that share sent two calls at once against a
/// burst of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_too_small_for_the_local_share_is_refused_with_a_clear_error() {
    use broker_core::{LimitSpec, Store};
    let mut server = RedisServer::start();
    let policy = local_fallback(0.5);
    let backend = quick(&server.url(), "tiny", true, policy).await;
    let spec = |limits: Limits| LimitSpec::new(&limits, Duration::from_secs(60));
    let rate = spec(Limits::new().rate(RateLimit::per_minute(1)));
    let slot = spec(Limits::new().max_concurrent(1));
    let tokens =
        spec(Limits::new().rate(RateLimit::per_minute(1000).unit(broker_core::Unit::Tokens)));
    server.kill();
    let refused = |r: Result<String, broker_core::BackendError>| match r {
        Err(e) => assert!(e.message.contains("admits nothing"), "{e}"),
        Ok(told) => panic!("told {told} by a share that admits nothing"),
    };
    let one = Cost::default();
    let d = backend.try_acquire("rate", &rate, one).await;
    refused(d.map(|d| format!("{d:?}")));
    let r = backend
        .book("rate", &rate, one, Duration::from_secs(120))
        .await;
    refused(r.map(|r| format!("{r:?}")));
    let d = backend.try_acquire("slot", &slot, one).await;
    refused(d.map(|d| format!("{d:?}")));
    let h = backend.take_slot("slot", &slot).await;
    refused(h.map(|h| format!("{h:?}")));
    // A booking takes no slot: on a concurrency limit alone, it is booked.
    let r = backend.book("slot", &slot, one, Duration::ZERO).await;
    assert!(
        r.unwrap().booked,
        "a booking refused for a slot it never takes"
    );
    // 600 tokens of a share of 500.
    let d = backend
        .try_acquire("tokens", &tokens, Cost::tokens(600))
        .await;
    refused(d.map(|d| format!("{d:?}")));
    // What fits the share is still decided here.
    let fits = backend
        .try_acquire("tokens", &tokens, Cost::tokens(500))
        .await;
    assert!(fits.unwrap().allowed);
    let spent = backend
        .try_acquire("tokens", &tokens, Cost::tokens(500))
        .await;
    assert!(!spent.unwrap().allowed, "the share is spent");
}

/// The state of `api` once what a late decision took has had time to come
/// back (at most 10 s): every bucket's tokens and the leases held, or
/// `None` when the state is fresh (full buckets, no lease).
async fn given_back(backend: &RedisBackend, full: &[f64]) -> Option<(Vec<f64>, usize)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = backend.state("api").await.unwrap().map(|s| {
            let tokens: Vec<f64> = s.buckets.iter().map(|b| b.tokens).collect();
            (tokens, s.leases.len())
        });
        let back = state.as_ref().is_none_or(|(tokens, leases)| {
            *leases == 0 && tokens.iter().zip(full).all(|(t, f)| t >= f)
        });
        if back || Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The give-back of a late decision on limits of two units and a
/// concurrency limit: a `try` of 1 request and 300 tokens that Redis ran
/// after the fail-closed policy had refused it gives back both buckets'
/// cost and its lease, alone, in a batch and with coalescing off (the
/// refund is built from the decision's own call: each bucket's operand is
/// its own unit's cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_decision_on_two_units_and_a_slot_gives_all_of_it_back() {
    use broker_core::{LimitSpec, Store, Unit};
    let server = RedisServer::start();
    let limits = Limits::new()
        .rate(RateLimit::per_minute(2))
        .rate(RateLimit::per_minute(1000).unit(Unit::Tokens))
        .max_concurrent(2);
    let spec = LimitSpec::new(&limits, Duration::from_secs(60));
    let cost = Cost {
        requests: 1,
        tokens: 300,
    };
    for mode in ["alone", "batch", "off"] {
        let prefix = format!("late2{mode}");
        let backend = timing_out(&server, prefix, mode, FailurePolicy::FailClosed).await;
        // Loads the scripts; its lease is released at once.
        let warm = backend.try_acquire("api", &spec, Cost::requests(0)).await;
        let lease = warm.unwrap().lease.expect("a slot");
        assert!(backend.release("api", lease).await.unwrap());
        let none = Cost::requests(0);
        backend
            .settle("api", &spec, none, none, None)
            .await
            .unwrap();

        server.pause();
        let told = backend.try_acquire("api", &spec, cost).await;
        assert!(told.is_err(), "{mode}: refused by the policy ({told:?})");
        server.resume();
        let state = given_back(backend.primary(), &[1.99, 999.9]).await;
        assert!(
            state
                .as_ref()
                .is_none_or(|(t, leases)| *leases == 0 && t[0] >= 1.99 && t[1] >= 999.9),
            "{mode}: Redis kept some of a refused call: {state:?} (tokens, leases)"
        );
    }
}

/// A `try_acquire` on a concurrency limit first sends the releases that
/// dropped permits have on their way (so a freed slot is free to it).
/// While Redis is down, each of them may be a probe, and against a hung
/// server each probe waits out the operation timeout: one after another,
/// they made the caller wait one timeout per release before its own
/// decision (here 4 × 400 ms, in virtual time), where the failure policy
/// answers a call within one. While Redis is down at most one of them
/// goes out (here the probe, which finds Redis still down): the rest are
/// left to a task of their own, and the decision to the failure policy.
#[tokio::test]
async fn releases_ahead_of_a_decision_do_not_make_it_wait_a_timeout_each_while_redis_is_down() {
    use broker_core::Store;
    let server = RedisServer::start();
    let backend = every_call_a_probe(&server.url())
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let op_timeout = OP_TIMEOUT;
    let broker = ResourceBroker::new(backend.clone());
    let limits = Limits::new()
        .rate(RateLimit::per_second(1000).with_burst(1_000_000))
        .max_concurrent(10);
    broker.register_limit("slots", limits).unwrap();
    // Loads the scripts; three permits to drop while Redis is down.
    let mut permits = Vec::new();
    for _ in 0..4 {
        let permit = broker.try_acquire("slots", Cost::default()).await.unwrap();
        assert!(permit.allowed && !permit.answered_here);
        permits.push(permit);
    }
    tokio::time::pause();
    server.pause();
    // Redis is found out of reach.
    let first = broker.try_acquire("slots", Cost::default()).await;
    assert!(first.expect("fail-open").allowed);
    assert!(backend.health().down);
    // Three permits dropped meanwhile: their releases are on their way.
    permits.truncate(1);
    let start = tokio::time::Instant::now();
    let answer = broker.try_acquire("slots", Cost::default()).await;
    let waited = start.elapsed();
    server.resume();
    assert!(answer.expect("fail-open answers").allowed);
    // Within one timeout (its own probe's), not one per release.
    assert!(
        waited < 2 * op_timeout,
        "the caller waited {waited:?} (virtual) for an operation timeout of {op_timeout:?}"
    );
}

/// Timeouts and a probe interval of `Duration::MAX` ("no limit", as
/// elsewhere in the library: the far future) are taken as such: no panic
/// on connecting, nor when an outage starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_timeouts_and_probe_interval_do_not_panic() {
    let mut server = RedisServer::start();
    let backend = RedisBackend::builder(&server.url())
        .connect_timeout(Duration::MAX)
        .response_timeout(Duration::MAX)
        .probe_interval(Duration::MAX)
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let broker = ResourceBroker::new(backend);
    let limits = Limits::new().rate(RateLimit::per_minute(1).with_burst(1));
    broker.register_limit("api", limits).unwrap();
    let a = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(a.allowed && !a.answered_here);
    server.kill();
    let a = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(a.allowed && a.answered_here, "fail-open answers");
    assert_eq!(broker.stats().backend.outages, 1);
    let a = broker.try_acquire("api", Cost::default()).await.unwrap();
    assert!(a.allowed && a.answered_here, "no probe within the interval");
}

/// A permit the local fallback granted while Redis was down is counted in
/// Redis once Redis is back (its first renewal after that takes its slot
/// there, as for a permit granted under fail-open): Redis lets no second
/// holder in under `max_concurrent(1)`, with a share of 1 (one replica).
/// Before, the permit was renewed in this process only, for as long as it
/// lived, and Redis, which never saw it, gave its slot to the next caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_fallback_permit_is_counted_in_redis_once_it_is_back() {
    let mut server = RedisServer::start();
    let broker = one_slot_under_local_fallback(&server, "fallback-moved").await;
    let warm = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(warm.allowed && !warm.answered_here);
    drop(warm);
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.kill();
    let first = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed && first.answered_here, "the local fallback's");
    server.restart();
    // Redis is found back by a call on another resource.
    broker
        .register_limit("other", Limits::new().rate(RateLimit::per_second(100)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while broker.stats().backend.down {
        assert!(Instant::now() < deadline, "Redis is found back");
        let _ = broker.try_acquire("other", Cost::default()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Renewals (every 100 ms) meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(!second.answered_here, "Redis answers again");
    let both = second.allowed;
    drop(second);
    drop(first);
    assert!(!both, "two holders under max_concurrent 1");
    // Its slot in Redis is freed with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let again = broker.try_acquire("r", Cost::default()).await.unwrap();
        if again.allowed {
            break;
        }
        assert!(Instant::now() < deadline, "the slot is freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first decision once Redis is found back is on a key with a release
/// on its way (a permit dropped just before): the release still goes out
/// ahead of it, so the slot freed here is free to it. Before, while Redis
/// was marked down the releases were left to a task of their own, and the
/// decision (then the probe that found Redis back) went out first: under
/// `max_concurrent(1)` it found the freed slot still held and was refused
/// it.
#[tokio::test]
async fn a_release_on_its_way_goes_out_ahead_of_the_first_decision_once_redis_is_back() {
    use broker_core::Store;
    let server = RedisServer::start();
    let backend = every_call_a_probe(&server.url())
        .connect_with_policy(FailurePolicy::FailClosed)
        .await
        .expect("connect");
    let broker = ResourceBroker::new(backend.clone());
    broker
        .register_limit("one", Limits::new().max_concurrent(1))
        .unwrap();
    let held = broker.try_acquire("one", Cost::default()).await.unwrap();
    assert!(held.allowed, "the slot is free");
    tokio::time::pause();
    server.pause();
    // Redis is found out of reach (no reply in time, virtual time).
    let lost = broker.try_acquire("one", Cost::default()).await;
    lost.expect_err("fail-closed: no reply in time");
    assert!(backend.health().down);
    // The permit is dropped: its release is on its way.
    drop(held);
    server.resume();
    tokio::time::resume();
    // Found back by the background probe.
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend.health().down {
        assert!(Instant::now() < deadline, "Redis is found back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = broker.try_acquire("one", Cost::default()).await;
    let next = next.expect("Redis answers");
    assert!(
        next.allowed,
        "the slot freed here is free to the next caller here"
    );
}

/// While Redis is down, a permit the local fallback granted and then
/// dropped (its release on its way, from a task of its own) frees its slot
/// for the next decision on its key here, as the release of any permit
/// does ahead of a decision: it is freed in this process, without I/O.
/// Before, while Redis was down such releases were left to a task, so
/// under `max_concurrent(1)` the next caller was refused the slot its
/// predecessor had just freed, for as long as the outage lasted.
#[tokio::test]
async fn a_local_fallback_release_on_its_way_frees_its_slot_while_redis_is_down() {
    use broker_core::{LimitSpec, Store};
    let mut server = RedisServer::start();
    let backend = with_op_timeout(&server.url())
        // No probe during the test: the local fallback answers.
        .probe_interval(Duration::from_secs(3600))
        .connect_with_policy(local_fallback(1.0))
        .await
        .expect("connect");
    let spec = LimitSpec::new(&Limits::new().max_concurrent(1), Duration::from_secs(30));
    let warm = backend.take_slot("one", &spec).await.unwrap();
    backend.release("one", warm.expect("free")).await.unwrap();
    let broker = ResourceBroker::new(backend.clone());
    broker
        .register_limit("one", Limits::new().max_concurrent(1))
        .unwrap();
    server.kill();
    let mut first = None;
    for _ in 0..10 {
        // The first call may find the connection gone only on its retry.
        if let Ok(a) = broker.try_acquire("one", Cost::default()).await {
            if a.allowed && backend.health().down {
                first = Some(a);
                break;
            }
        }
    }
    let first = first.expect("the local fallback's slot, Redis down");
    // Its permit is dropped: its release is on its way.
    drop(first);
    let next = broker.try_acquire("one", Cost::default()).await;
    let next = next.expect("the local fallback answers");
    assert!(backend.health().down);
    assert!(
        next.allowed,
        "the slot freed here is free to the next caller here"
    );
}
