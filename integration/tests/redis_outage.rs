//! While Redis is out of reach: callers are answered by the failure policy
//! at once (a background `PING` finds Redis back), releases that could not
//! be sent are kept and sent once it answers again, and no decision waits
//! longer than the response timeout.

mod redis_support;

use std::sync::Arc;
use std::time::Duration;

use broker_core::{BackendError, Cost, Decision, LimitSpec, Limits, RateLimit, ResourceBroker};
use broker_core::{Failover, FailurePolicy, Store};
use broker_redis::{RedisBackend, RedisBackendBuilder};
use broker_testkit::RedisServer;
use tokio::task::JoinHandle;

/// Waits (real time, at most 10 s) until `backend` reads up again, with no
/// call of its own: only the background probe can find Redis back.
async fn until_found_back(backend: &impl Store) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while backend.health().down {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe finds Redis back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// While Redis is frozen, every decision is answered by the failure policy
/// at once, and none is let through as a probe: of 50 decisions spread
/// over 10 probe intervals, none waits for the response timeout (2 s).
/// Redis is then found back by the background probe, with no call. Before,
/// one caller per probe interval was the probe, and waited out the whole
/// timeout. In real time (the probe interval runs on the system clock);
/// the bound checked is the timeout, not a speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_caller_waits_as_a_probe_while_redis_is_frozen() {
    let server = RedisServer::start();
    let timeout = Duration::from_secs(2);
    let backend = RedisBackend::builder(&server.url())
        .response_timeout(timeout)
        .probe_interval(Duration::from_millis(50))
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let backend = Arc::new(backend);
    let spec = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_second(1000).with_burst(1_000_000)),
        Duration::from_secs(30),
    );
    let warm = backend.try_acquire("api", &spec, Cost::default()).await;
    assert!(!warm.expect("Redis answers").answered_here);
    server.pause();
    // Redis is found out of reach: no reply in time.
    let first = backend.try_acquire("api", &spec, Cost::default()).await;
    assert!(first.expect("fail-open").answered_here);
    assert!(backend.health().down);

    let mut calls = Vec::new();
    for _ in 0..50 {
        calls.push(timed_try_acquire(&backend, "api", &spec));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut probes = 0;
    for call in calls {
        let (d, took) = call.await.unwrap();
        assert!(d.expect("fail-open").answered_here);
        probes += usize::from(took >= timeout);
    }
    assert_eq!(
        probes, 0,
        "callers waited out the response timeout as probes while Redis was frozen"
    );

    server.resume();
    until_found_back(&*backend).await;
    let d = backend.try_acquire("api", &spec, Cost::default()).await;
    assert!(!d.expect("Redis answers").answered_here);
    assert_eq!(backend.health().outages, 1);
}

/// A permit Redis granted, dropped while Redis is frozen and marked down:
/// its release is kept and sent once Redis answers again, so another
/// replica finds all 4 slots free long before the lease's TTL (60 s).
/// Before, the outage gate held the release back and nothing sent it
/// again: 3 of 4 slots were free until the lease expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_held_back_while_redis_is_down_is_sent_once_it_answers() {
    let server = RedisServer::start();
    let backend = redis_support::with_op_timeout(&server.url())
        .prefix("kept")
        .probe_interval(Duration::from_millis(20))
        .connect_with_policy(FailurePolicy::FailClosed)
        .await
        .expect("connect");
    let broker = ResourceBroker::new(backend.clone());
    let limits = Limits::new().max_concurrent(4);
    broker.register_limit("slots", limits.clone()).unwrap();
    let permit = broker.try_acquire("slots", Cost::default()).await.unwrap();
    assert!(permit.allowed && !permit.answered_here);

    server.pause();
    // A decision gets no reply in time: Redis is marked down.
    let refused = broker.try_acquire("slots", Cost::default()).await;
    assert!(refused.is_err(), "fail-closed: {refused:?}");
    assert!(backend.health().down);
    drop(permit);
    // The release's task runs while Redis is down.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.resume();
    // Found back (by the probe; before, by a call on another resource).
    broker
        .register_limit("other", Limits::new().rate(RateLimit::per_second(100)))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while backend.health().down {
        assert!(std::time::Instant::now() < deadline, "Redis is found back");
        let _ = broker.try_acquire("other", Cost::default()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Another replica, with no release of its own in flight.
    let other = redis_support::with_op_timeout(&server.url())
        .prefix("kept")
        .connect_with_policy(FailurePolicy::FailClosed)
        .await
        .expect("connect");
    let other = ResourceBroker::new(other);
    other.register_limit("slots", limits).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut permits = Vec::new();
        for _ in 0..4 {
            permits.push(other.try_acquire("slots", Cost::default()).await.unwrap());
        }
        let free = permits.iter().filter(|p| p.allowed).count();
        assert!(permits.iter().all(|p| !p.answered_here));
        if free == 4 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{free} of 4 slots free 10 s after Redis answered again (lease TTL 60 s)"
        );
        drop(permits);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A backend on `server` whose only timeout set is a response timeout of
/// `timeout` (the connect timeout keeps its default, 1 s), its scripts
/// loaded; `coalesce`: whether `try_acquire` calls are coalesced.
async fn bounded(
    server: &RedisServer,
    prefix: &str,
    timeout: Duration,
    coalesce: bool,
) -> Failover<RedisBackend> {
    let backend = RedisBackend::builder(&server.url())
        .prefix(prefix)
        .coalesce(coalesce)
        .response_timeout(timeout)
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let spec = slots();
    let none = Cost::requests(0);
    let d = backend.try_acquire("warm", &spec, none).await.unwrap();
    assert!(!d.answered_here);
    let r = backend.book("warm", &spec, none, Duration::ZERO).await;
    assert!(r.unwrap().booked);
    let lease = backend.take_slot("warm", &spec).await.unwrap();
    backend.release("warm", lease.expect("free")).await.unwrap();
    backend
}

/// A rate and a concurrency limit that admit every call of these tests.
fn slots() -> LimitSpec {
    LimitSpec::new(
        &Limits::new()
            .rate(RateLimit::per_second(1000).with_burst(1_000_000))
            .max_concurrent(1000),
        Duration::from_secs(30),
    )
}

/// Against a frozen server, no decision waits longer than the response
/// timeout (300 ms, the connect timeout left at 1 s), whichever way it
/// goes: a lone `try_acquire`, ten at once (five sent, five queued behind
/// them), one uncoalesced, one behind a release sent ahead of it, a
/// `book`, a `take_slot`. In virtual time, where the timeouts run
/// exactly (a millisecond of timer granularity allowed). Before, a call
/// could wait the connect and the response timeouts together: 1.3 s.
#[tokio::test]
async fn no_decision_waits_longer_than_the_response_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let spec = slots();
    let one = Cost::default();
    let paths = [
        "lone",
        "ten at once",
        "uncoalesced",
        "release ahead",
        "book",
        "take_slot",
    ];
    let mut backends = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let prefix = format!("bound{i}");
        backends.push((
            *path,
            bounded(&server, &prefix, timeout, *path != "uncoalesced").await,
        ));
    }
    // A permit to drop just before a decision on its key.
    let broker = ResourceBroker::new(backends[3].1.clone());
    let limits = Limits::new()
        .rate(RateLimit::per_second(1000).with_burst(1_000_000))
        .max_concurrent(1000);
    broker.register_limit("r", limits).unwrap();
    let mut permit = Some(broker.try_acquire("r", one).await.unwrap());
    tokio::time::pause();
    server.pause();
    for (path, backend) in &backends {
        let start = tokio::time::Instant::now();
        match *path {
            "ten at once" => {
                let calls = (0..10).map(|_| backend.try_acquire("r", &spec, one));
                for d in futures::future::join_all(calls).await {
                    assert!(d.expect("fail-open").answered_here, "{path}");
                }
            }
            "release ahead" => {
                drop(permit.take());
                let d = broker.try_acquire("r", one).await;
                assert!(d.expect("fail-open").answered_here, "{path}");
            }
            "book" => {
                let r = backend.book("r", &spec, one, Duration::ZERO).await;
                assert!(r.expect("fail-open").booked, "{path}");
            }
            "take_slot" => {
                let held = backend.take_slot("r", &spec).await;
                assert!(held.expect("fail-open").is_some(), "{path}");
            }
            _ => {
                let d = backend.try_acquire("r", &spec, one).await;
                assert!(d.expect("fail-open").answered_here, "{path}");
            }
        }
        let took = start.elapsed();
        assert!(
            took <= timeout + Duration::from_millis(1),
            "{path}: a decision waited {took:?} (virtual) with a response timeout of {timeout:?}"
        );
        assert!(backend.health().down, "{path}: answered on the timeout");
    }
    server.resume();
}

/// The same bound in real time, for one lone decision against a frozen
/// server: it returns within the response timeout (300 ms) and a margin
/// of 500 ms for a loaded machine; the bound is checked, not a speed.
/// Before, it waited the connect and the response timeouts: 1.3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_on_a_frozen_server_returns_within_the_response_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let backend = bounded(&server, "real", timeout, true).await;
    server.pause();
    let start = std::time::Instant::now();
    let d = backend.try_acquire("r", &slots(), Cost::default()).await;
    let took = start.elapsed();
    server.resume();
    assert!(d.expect("fail-open").answered_here);
    assert!(
        took < timeout + Duration::from_millis(500),
        "a decision waited {took:?} with a response timeout of {timeout:?}"
    );
}

/// What [`holding_proxy`] lets through: while `held`, Redis's replies wait,
/// but for as many reads as `let_through` counts down.
#[derive(Default)]
struct Gate {
    held: std::sync::atomic::AtomicBool,
    let_through: std::sync::atomic::AtomicUsize,
}

/// A TCP proxy to Redis on `upstream` that passes commands at once and
/// holds Redis's replies as `gate` says: a server slow to answer, as the
/// client sees it. Its port.
async fn holding_proxy(upstream: u16, gate: Arc<Gate>) -> u16 {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    redis_support::proxy(upstream, move |client, server| {
        let gate = gate.clone();
        async move {
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
            let mut buf = vec![0u8; 65536];
            while let Ok(n @ 1..) = sr.read(&mut buf).await {
                while gate.held.load(Ordering::SeqCst)
                    && gate
                        .let_through
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// A fail-open backend (`configure`d) with a response timeout of
/// `timeout`, reaching `server` through a [`holding_proxy`], its
/// `try_acquire` script loaded; and the proxy's gate, open.
async fn behind_a_gate(
    server: &RedisServer,
    timeout: Duration,
    configure: impl FnOnce(RedisBackendBuilder) -> RedisBackendBuilder,
) -> (Arc<Failover<RedisBackend>>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let port = holding_proxy(server.port(), gate.clone()).await;
    let backend = configure(RedisBackend::builder(&format!("redis://127.0.0.1:{port}/")))
        .response_timeout(timeout)
        .connect_with_policy(FailurePolicy::FailOpen)
        .await
        .expect("connect");
    let warm = backend.try_acquire("r", &slots(), Cost::default()).await;
    assert!(!warm.expect("Redis answers").answered_here);
    (Arc::new(backend), gate)
}

/// A `try_acquire` of one request on `key`, in a task of its own: its
/// answer and how long it took, in real time.
fn timed_try_acquire<S: Store>(
    backend: &Arc<S>,
    key: &'static str,
    spec: &LimitSpec,
) -> JoinHandle<(Result<Decision, BackendError>, Duration)> {
    let (backend, spec) = (backend.clone(), spec.clone());
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        let d = backend.try_acquire(key, &spec, Cost::default()).await;
        (d, start.elapsed())
    })
}

/// A decision queued behind a call in flight (coalescing, one call in
/// flight) is answered within the response timeout from its start, though
/// the call ahead of it took most of that and its own call then gets no
/// reply: a batch waits no longer than its earliest decision's bound.
/// Before, once sent, it waited a whole timeout of its own: 1.6 s + 2 s.
/// In real time (a proxy holds Redis's replies); the bound is checked
/// (2 s and a margin of 1 s for a loaded machine), not a speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_queued_behind_a_slow_call_waits_no_longer_than_the_response_timeout() {
    use std::sync::atomic::Ordering;
    let server = RedisServer::start();
    let timeout = Duration::from_secs(2);
    let (backend, gate) = behind_a_gate(&server, timeout, |b| b.coalesce_limits(32, 1)).await;

    gate.held.store(true, Ordering::SeqCst);
    let ahead = timed_try_acquire(&backend, "r", &slots());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queued = timed_try_acquire(&backend, "r", &slots());
    tokio::time::sleep(Duration::from_millis(1550)).await;
    // The reply to the call ahead, 1.6 s after it went out.
    gate.let_through.store(1, Ordering::SeqCst);
    let (ahead, _) = ahead.await.unwrap();
    assert!(!ahead.expect("Redis answers").answered_here);
    let (d, took) = queued.await.unwrap();
    gate.held.store(false, Ordering::SeqCst);
    assert!(d.expect("fail-open").answered_here, "no reply in time");
    assert!(
        took < timeout + Duration::from_secs(1),
        "the queued decision waited {took:?} with a response timeout of {timeout:?}"
    );
}

/// A decision with a release sent ahead of it (a permit dropped just
/// before, on its key) is answered within the response timeout from its
/// start, though the release took most of that and the decision then gets
/// no reply: both share the decision's bound. Before, each had a whole
/// timeout of its own: 1.6 s + 2 s. In real time, as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_behind_a_slow_release_waits_no_longer_than_the_response_timeout() {
    use std::sync::atomic::Ordering;
    let server = RedisServer::start();
    let timeout = Duration::from_secs(2);
    let (backend, gate) = behind_a_gate(&server, timeout, |b| b).await;
    // Loads the release's script.
    backend.release("r", 1).await.expect("Redis answers");
    let broker = ResourceBroker::from_arc(backend.clone());
    broker
        .register_limit("r", Limits::new().max_concurrent(1000))
        .unwrap();
    let permit = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(permit.allowed && !permit.answered_here);

    gate.held.store(true, Ordering::SeqCst);
    // A permit dropped: its release is on its way, and goes out first.
    drop(permit);
    let decision = tokio::spawn(async move {
        let start = std::time::Instant::now();
        let d = broker.try_acquire("r", Cost::default()).await;
        (d, start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // The reply to the release.
    gate.let_through.store(1, Ordering::SeqCst);
    let (d, took) = decision.await.unwrap();
    gate.held.store(false, Ordering::SeqCst);
    assert!(d.expect("fail-open").answered_here, "no reply in time");
    assert!(
        took < timeout + Duration::from_secs(1),
        "the decision waited {took:?} with a response timeout of {timeout:?}"
    );
}
