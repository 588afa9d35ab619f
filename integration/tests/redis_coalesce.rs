//! Coalescing of concurrent `try_acquire` calls on one RedisBackend, on a
//! real redis-server: concurrent calls share `EVALSHA`s, a lone call is one
//! `EVALSHA`, a tight limit admits exactly its quota, a script error reaches
//! only its own caller, an outage reaches every waiting caller through the
//! failure policy, and a caller that goes away leaks no lease.

mod redis_support;
use redis_support::{every_call_a_probe, with_op_timeout, OP_TIMEOUT};

use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::FailurePolicy;
use broker_core::{Cost, LimitSpec, Limits, ManualClock, RateLimit, Store};
use broker_redis::{RedisBackend, RedisBackendBuilder};
use broker_testkit::{command_calls, RedisServer};
use futures::future::join_all;

/// A backend in client-time mode on a clock that never moves, so no bucket
/// refills during a test.
async fn backend(
    server: &RedisServer,
    configure: fn(RedisBackendBuilder) -> RedisBackendBuilder,
) -> RedisBackend {
    configure(RedisBackend::builder(&server.url()))
        .client_time(Arc::new(ManualClock::new()))
        .connect()
        .await
        .expect("connect")
}

fn spec(limits: Limits) -> LimitSpec {
    LimitSpec::new(&limits, Duration::from_secs(30))
}

/// Runs `n` concurrent tries of cost 1 on `key`; the answers in order.
async fn concurrent_tries(
    backend: &impl Store,
    key: &str,
    spec: &LimitSpec,
    n: usize,
) -> Vec<Result<broker_core::Decision, broker_core::BackendError>> {
    join_all((0..n).map(|_| backend.try_acquire(key, spec, Cost::default()))).await
}

#[tokio::test]
async fn concurrent_calls_share_evalshas_and_a_lone_call_is_one_evalsha() {
    let server = RedisServer::start();
    let backend = backend(&server, |b| b).await;
    let spec = spec(Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)));
    // Loads both scripts (a lone call, then a batch).
    concurrent_tries(&backend, "api", &spec, 10).await;

    server.command("CONFIG RESETSTAT");
    let lone = backend
        .try_acquire("api", &spec, Cost::default())
        .await
        .unwrap();
    assert!(lone.allowed);
    let stats = server.command("INFO commandstats");
    assert_eq!(command_calls(&stats, "evalsha"), 1, "{stats}");
    assert_eq!(command_calls(&stats, "hset"), 1, "{stats}");

    server.command("CONFIG RESETSTAT");
    let decisions = concurrent_tries(&backend, "api", &spec, 200).await;
    assert!(decisions.iter().all(|d| d.as_ref().unwrap().allowed));
    let stats = server.command("INFO commandstats");
    let evalsha = command_calls(&stats, "evalsha");
    assert!(
        (1..200).contains(&evalsha),
        "200 concurrent decisions took {evalsha} EVALSHAs: {stats}"
    );
    // Every decision took its token (the clock stands still): 10 + 1 + 200.
    assert_eq!(server.command("HGET rb:{api}:b tokens:1"), "999789");
}

#[tokio::test]
async fn coalescing_off_sends_one_evalsha_per_decision() {
    let server = RedisServer::start();
    let backend = backend(&server, |b| b.coalesce(false)).await;
    let spec = spec(Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)));
    concurrent_tries(&backend, "api", &spec, 1).await;
    server.command("CONFIG RESETSTAT");
    concurrent_tries(&backend, "api", &spec, 50).await;
    let stats = server.command("INFO commandstats");
    assert_eq!(command_calls(&stats, "evalsha"), 50, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tight_limit_admits_exactly_its_quota_under_concurrent_calls() {
    let server = RedisServer::start();
    let backend = backend(&server, |b| b).await;
    let rate = spec(Limits::new().rate(RateLimit::per_minute(1).with_burst(25)));
    server.command("CONFIG RESETSTAT");
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let b = backend.clone();
            let s = rate.clone();
            tokio::spawn(async move { b.try_acquire("rate", &s, Cost::default()).await })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        allowed += usize::from(t.await.unwrap().unwrap().allowed);
    }
    assert_eq!(allowed, 25, "exactly the burst");
    let stats = server.command("INFO commandstats");
    assert!(command_calls(&stats, "evalsha") < 300, "coalesced: {stats}");

    // A concurrency limit: exactly max_concurrent leases, all in the set.
    let slots = spec(
        Limits::new()
            .rate(RateLimit::per_second(1000).with_burst(1_000_000))
            .max_concurrent(7),
    );
    let decisions = concurrent_tries(&backend, "slots", &slots, 120).await;
    let leases: Vec<_> = decisions
        .iter()
        .filter_map(|d| d.as_ref().unwrap().lease)
        .collect();
    assert_eq!(leases.len(), 7);
    assert_eq!(server.command("ZCARD rb:{slots}:l"), ":7");
    for lease in leases {
        assert!(backend.release("slots", lease).await.unwrap());
    }
    assert_eq!(server.command("ZCARD rb:{slots}:l"), ":0");
}

#[tokio::test]
async fn a_script_error_reaches_only_its_own_caller() {
    let server = RedisServer::start();
    let backend = backend(&server, |b| b).await;
    let spec = spec(Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)));
    // A key of the wrong type: the script's HMGET fails with WRONGTYPE.
    server.command("SET rb:{bad}:b x");
    let alone = backend
        .try_acquire("bad", &spec, Cost::default())
        .await
        .expect_err("WRONGTYPE");
    assert!(alone.message.contains("WRONGTYPE"), "{alone}");

    server.command("CONFIG RESETSTAT");
    let calls_of = |key: &'static str| backend.try_acquire(key, &spec, Cost::default());
    let mut futures = Vec::new();
    for i in 0..40 {
        futures.push(calls_of(if i % 10 == 9 { "bad" } else { "good" }));
    }
    let results = join_all(futures).await;
    for (i, r) in results.iter().enumerate() {
        if i % 10 == 9 {
            let e = r.as_ref().expect_err("WRONGTYPE");
            assert!(e.message.contains("WRONGTYPE"), "{e}");
        } else {
            assert!(r.as_ref().expect("the others decide").allowed);
        }
    }
    let stats = server.command("INFO commandstats");
    assert!(command_calls(&stats, "evalsha") < 40, "coalesced: {stats}");
    assert_eq!(
        server.command("HGET rb:{good}:b tokens:1"),
        "999964",
        "every good decision took its token"
    );
    assert!(!backend.health().down, "a script error is no outage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_reaches_every_waiting_caller_through_the_policy() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(&server.url())
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let spec = spec(Limits::new().rate(RateLimit::per_minute(1).with_burst(1)));
    concurrent_tries(&backend, "api", &spec, 5).await;
    server.pause();
    let answers = tokio::time::timeout(
        Duration::from_secs(20),
        concurrent_tries(&backend, "api", &spec, 40),
    )
    .await
    .expect("every caller is answered while the server hangs");
    server.resume();
    for a in answers {
        assert!(a.expect("fail-open answers").allowed);
    }
    let health = backend.health();
    assert!(health.down);
    assert_eq!(health.outages, 1);
    assert_eq!(health.handled_errors, 40, "every caller went to the policy");
}

/// Waits (up to 10 s) until the lease set of `key` is empty.
async fn lease_set_empties(server: &RedisServer, key: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if server.command(&format!("ZCARD rb:{{{key}}}:l")) == ":0" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_go_away_after_sending_leak_no_lease() {
    for every_call in [false, true] {
        let server = RedisServer::start();
        let backend = if every_call {
            backend(&server, |b| b.coalesce_every_call()).await
        } else {
            backend(&server, |b| b).await
        };
        let slots = spec(
            Limits::new()
                .rate(RateLimit::per_second(1000).with_burst(1_000_000))
                .max_concurrent(3),
        );
        concurrent_tries(&backend, "warm", &slots, 5).await;
        server.command("CONFIG RESETSTAT");
        server.pause();
        // Every caller gives up while the server is frozen: the calls in
        // flight were sent, the queued ones were not.
        let gone = join_all((0..6).map(|_| {
            tokio::time::timeout(
                Duration::from_millis(100),
                backend.try_acquire("slots", &slots, Cost::default()),
            )
        }))
        .await;
        assert!(gone.iter().all(Result::is_err), "all timed out");
        server.resume();
        // A call on the same connection, behind the ones sent while frozen.
        let rate = spec(Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)));
        assert!(
            backend
                .try_acquire("sync", &rate, Cost::default())
                .await
                .unwrap()
                .allowed
        );
        assert!(
            lease_set_empties(&server, "slots").await,
            "the leases granted to callers that went away were released"
        );
        let stats = server.command("INFO commandstats");
        assert!(
            command_calls(&stats, "zadd") >= 2,
            "leases were granted: {stats}"
        );
        // All three slots are free again.
        let again = concurrent_tries(&backend, "slots", &slots, 3).await;
        assert!(again.iter().all(|d| d.as_ref().unwrap().allowed));
    }
}

/// The fields a bucket hash of one or two buckets may hold, and their
/// values (as Redis holds them).
fn hash(server: &RedisServer, key: &str) -> Vec<(String, String)> {
    let fields = ["n", "tokens:1", "ts:1", "nb:1", "tokens:2", "ts:2", "nb:2"];
    fields
        .iter()
        .map(|f| (f.to_string(), server.command(&format!("HGET {key} {f}"))))
        .collect()
}

#[tokio::test]
async fn coalesced_decisions_equal_the_same_decisions_one_by_one() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    // One call in flight: the first decision goes alone and the rest queue
    // in the order they were made, so they reach Redis in that order.
    // (Calls in flight at once may arrive in any order, as any concurrent
    // calls may; the comparison needs one order.)
    let connect = |coalesce: bool| {
        RedisBackend::builder(&server.url())
            .client_time(Arc::new(clock.clone()))
            .coalesce(coalesce)
            .coalesce_limits(64, 1)
            .connect()
    };
    let (on, off) = (connect(true).await.unwrap(), connect(false).await.unwrap());
    let specs = [
        spec(Limits::new().rate(RateLimit::per_second(7).with_burst(20))),
        spec(
            Limits::new()
                .rate(RateLimit::per_second(5).with_burst(30))
                .rate(RateLimit::per_minute(1000).unit(broker_core::Unit::Tokens))
                .max_concurrent(9),
        ),
    ];
    let costs = |i: usize| Cost {
        requests: 1 + (i % 3) as u64,
        tokens: (i * 37 % 100) as u64,
    };
    server.command("CONFIG RESETSTAT");
    for round in 0..6 {
        for (s, spec) in specs.iter().enumerate() {
            // The same decisions in the same order on two keys each: one
            // backend coalesces them, the other sends them one by one.
            let run = |b: &RedisBackend, key: String| {
                let b = b.clone();
                let spec = spec.clone();
                async move {
                    join_all((0..40).map(|i| {
                        let (b, key, spec) = (b.clone(), key.clone(), spec.clone());
                        async move { b.try_acquire(&key, &spec, costs(i + round)).await.unwrap() }
                    }))
                    .await
                }
            };
            let a = run(&on, format!("on{s}")).await;
            let b = run(&off, format!("off{s}")).await;
            let summary = |d: &[broker_core::Decision]| {
                d.iter()
                    .map(|d| (d.allowed, d.wait, d.denied_by, d.lease.is_some()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(summary(&a), summary(&b), "round {round}, spec {s}");
            assert_eq!(
                hash(&server, &format!("rb:{{on{s}}}:b")),
                hash(&server, &format!("rb:{{off{s}}}:b")),
                "round {round}, spec {s}: same bucket state"
            );
            // Set a few ms apart (at the end of a batch, or by each call).
            let (ta, tb) = (
                server.pttl(&format!("rb:{{on{s}}}:b")),
                server.pttl(&format!("rb:{{off{s}}}:b")),
            );
            assert!(
                (ta - tb).abs() <= 100,
                "round {round}, spec {s}: ttl {ta} vs {tb} ms"
            );
            assert_eq!(
                server.command(&format!("ZCARD rb:{{on{s}}}:l")),
                server.command(&format!("ZCARD rb:{{off{s}}}:l")),
            );
        }
        clock.advance(Duration::from_millis(730));
    }
    let stats = server.command("INFO commandstats");
    assert!(
        command_calls(&stats, "evalsha") < 2 * 6 * 2 * 40,
        "some were coalesced: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_batch_is_one_call_per_slot_and_admits_exactly_each_quota() {
    let cluster = broker_testkit::RedisCluster::start(3);
    let backend = RedisBackend::builder(&cluster.urls()[0])
        .cluster(cluster.urls())
        .client_time(Arc::new(ManualClock::new()))
        .connect()
        .await
        .expect("connect to the cluster");
    let spec = spec(Limits::new().rate(RateLimit::per_minute(1).with_burst(10)));
    let keys: Vec<String> = (0..6).map(|i| format!("tenant{i}")).collect();
    for n in cluster.nodes() {
        n.command("CONFIG RESETSTAT");
    }
    let decisions = join_all(
        (0..300).map(|i| backend.try_acquire(&keys[i % keys.len()], &spec, Cost::default())),
    )
    .await;
    for (k, key) in keys.iter().enumerate() {
        let allowed = decisions
            .iter()
            .enumerate()
            .filter(|(i, d)| i % keys.len() == k && d.as_ref().expect(key).allowed)
            .count();
        assert_eq!(allowed, 10, "{key}: exactly its burst");
    }
    let evalsha: u64 = cluster
        .nodes()
        .iter()
        .map(|n| command_calls(&n.command("INFO commandstats"), "evalsha"))
        .sum();
    assert!(
        evalsha < 300,
        "coalesced: {evalsha} EVALSHAs for 300 decisions"
    );
}

/// A queued caller that goes away after its batch answered it, but before
/// it read that answer (its task was woken, and dropped before it ran: a
/// timeout or a client gone at that moment): the lease it was granted is
/// released. Before, the answer sat in the dropped channel, and the slot
/// stayed taken until the lease's TTL (30 s here), by no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_with_its_answer_unread_leaks_no_lease() {
    let server = RedisServer::start();
    // One call in flight: the next one queues behind it.
    let backend = backend(&server, |b| b.coalesce_limits(32, 1)).await;
    let rate = spec(Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)));
    let slots = spec(
        Limits::new()
            .rate(RateLimit::per_second(1000).with_burst(1_000_000))
            .max_concurrent(1),
    );
    // Loads the scripts.
    concurrent_tries(&backend, "warm", &slots, 3).await;
    concurrent_tries(&backend, "warm", &rate, 3).await;
    server.command("DEL rb:{warm}:l");

    server.pause();
    // In flight, while the server is frozen.
    let first = {
        let (b, s) = (backend.clone(), rate.clone());
        tokio::spawn(async move { b.try_acquire("other", &s, Cost::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Queued behind it: polled once, then never again.
    let mut queued = Box::pin(backend.try_acquire("slots", &slots, Cost::default()));
    assert!(futures::poll!(queued.as_mut()).is_pending());
    server.resume();
    assert!(first.await.unwrap().unwrap().allowed);
    // The queued decision ran (its lease is in the set) and its answer is
    // sent to it meanwhile.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.command("ZCARD rb:{slots}:l") != ":1" {
        assert!(Instant::now() < deadline, "the queued decision ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(queued);
    assert!(
        lease_set_empties(&server, "slots").await,
        "the lease of a caller gone with its answer unread was released"
    );
}

/// Callers queued behind calls to a server that hangs are answered by the
/// failure policy once a call in flight finds it out of reach (no reply
/// within the operation timeout), as new calls are: in virtual time, every
/// one of 400 concurrent callers is answered within twice the operation
/// timeout. Before, the queue was still sent to the hung server a batch at
/// a time, each batch waiting out its own timeout: with the default limits
/// (32 a batch, 5 in flight) the last callers waited four timeouts, and
/// a queue of thousands waited minutes.
#[tokio::test]
async fn callers_queued_behind_a_hung_server_are_answered_within_the_timeout() {
    let server = RedisServer::start();
    let backend = with_op_timeout(&server.url())
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let op_timeout = OP_TIMEOUT;
    let spec = spec(Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)));
    // Loads the scripts.
    concurrent_tries(&backend, "api", &spec, 40).await;
    tokio::time::pause();
    server.pause();
    let start = tokio::time::Instant::now();
    let answers = join_all((0..400).map(|_| async {
        let a = backend.try_acquire("api", &spec, Cost::default()).await;
        (a, start.elapsed())
    }))
    .await;
    server.resume();
    let slowest = answers.iter().map(|(_, t)| *t).max().unwrap();
    for (a, _) in &answers {
        assert!(a.as_ref().expect("fail-open answers").allowed);
    }
    assert!(backend.health().down);
    assert_eq!(backend.health().handled_errors, 400);
    assert!(
        slowest <= 2 * op_timeout,
        "the last caller waited {slowest:?} (virtual) for an operation timeout of {op_timeout:?}"
    );
}

/// A decision answered by the failure policy because the call in flight
/// when it queued got no reply in time ([`Reply::Unsent`] inside the
/// coalescer) is a stale sign of the outage once Redis has answered a call
/// since: it neither marks Redis down again nor counts a second outage.
/// Before, its caller's answer, read after the recovery, flipped the
/// health back to down (so the next calls were answered by the policy
/// until the next probe) and counted and logged one outage more than
/// happened: `outages` was 2 and `down` true here.
#[tokio::test]
async fn an_answer_from_before_a_recovery_does_not_mark_redis_down_again() {
    let server = RedisServer::start();
    let backend = every_call_a_probe(&server.url())
        // One call in flight: the second decision queues behind the first.
        .coalesce_limits(32, 1)
        .connect_with_policy(FailurePolicy::FailClosed)
        .await
        .expect("connect");
    let spec = spec(Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)));
    // Loads the scripts.
    concurrent_tries(&backend, "api", &spec, 4).await;
    tokio::time::pause();
    server.pause();
    let mut first = Box::pin(backend.try_acquire("api", &spec, Cost::default()));
    let mut queued = Box::pin(backend.try_acquire("api", &spec, Cost::default()));
    assert!(futures::poll!(&mut first).is_pending(), "sent alone");
    assert!(futures::poll!(&mut queued).is_pending(), "queued behind it");
    // No reply within the timeout (virtual time): the outage starts, and
    // the queued decision is answered by the policy, unsent; its caller
    // reads that answer only after the recovery below.
    first.await.expect_err("fail-closed: no reply in time");
    assert_eq!((backend.health().down, backend.health().outages), (true, 1));
    server.resume();
    tokio::time::resume();
    // Found back by the background probe.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while backend.health().down {
        assert!(std::time::Instant::now() < deadline, "the outage is over");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answered = backend.try_acquire("api", &spec, Cost::default()).await;
    assert!(answered.expect("redis answers again").allowed);
    queued
        .await
        .expect_err("answered by the policy (fail-closed), unsent");
    let health = backend.health();
    assert_eq!(
        (health.down, health.outages),
        (false, 1),
        "an answer to a call from before the recovery ends no outage and starts none"
    );
    assert_eq!(health.handled_errors, 2, "both answered by the policy");
    let after = backend.try_acquire("api", &spec, Cost::default()).await;
    assert!(after.expect("shared decisions again").allowed);
}
