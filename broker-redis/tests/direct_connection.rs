//! The direct connection (a call that finds it free writes and reads on its
//! own task): it says what the URL asks for first, a call dropped before
//! its reply never hands that reply to the next call, and busy polling
//! (on by default) changes no answer.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Backend, Cost, LimitSpec, Limits, ManualClock, RateLimit};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;
use futures::FutureExt;

fn spec(burst: u64) -> LimitSpec {
    let limits = Limits::new().rate(RateLimit::per(1, Duration::from_secs(3600)).with_burst(burst));
    LimitSpec::new(&limits, Duration::from_secs(30))
}

#[tokio::test]
async fn calls_authenticate_and_use_the_database_of_the_url() {
    let server = RedisServer::start();
    server.command("CONFIG SET requirepass s3cret");
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", server.port());
    let b = RedisBackend::connect(&url).await.expect("connect");
    for i in 0..5 {
        let d = b
            .try_acquire("k", &spec(10), Cost::default())
            .await
            .expect("every call answered");
        assert!(d.allowed, "call {i}");
    }
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("check connection");
    let exists: i64 = redis::cmd("EXISTS")
        .arg("rb:{k}:b")
        .query_async(&mut c)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 1, "the bucket is in database 3");
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut c)
        .await
        .expect("CLIENT LIST");
    assert!(
        clients
            .lines()
            .all(|l| l.contains(" db=3 ") || !l.contains("cmd=evalsha")),
        "every connection that ran a script had selected database 3:\n{clients}"
    );
    let mut db0 = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{}/0", server.port()))
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("db 0");
    let in_db0: i64 = redis::cmd("EXISTS")
        .arg("rb:{k}:b")
        .query_async(&mut db0)
        .await
        .expect("EXISTS");
    assert_eq!(in_db0, 0, "nothing written to database 0");
}

#[tokio::test]
async fn a_call_dropped_before_its_reply_leaves_nothing_for_the_next_call() {
    let server = RedisServer::start();
    for (coalesce, busy_poll) in [(true, true), (false, true), (true, false), (false, false)] {
        let mut builder = RedisBackend::builder(&server.url())
            .prefix(format!("c{coalesce}p{busy_poll}"))
            .coalesce(coalesce);
        if !busy_poll {
            builder = builder.busy_poll(Duration::ZERO);
        }
        let b = builder.connect().await.expect("connect");
        let (spent, fresh) = (spec(1), spec(1_000_000));
        assert!(
            b.try_acquire("spent", &spent, Cost::default())
                .await
                .unwrap()
                .allowed
        );
        for i in 0..20 {
            // Written, then dropped while its reply (a denial) is on its way:
            // the server is paused meanwhile, since a polling call may
            // otherwise find a quick reply before it first yields.
            server.pause();
            let dropped = b
                .try_acquire("spent", &spent, Cost::default())
                .now_or_never();
            server.resume();
            assert!(
                dropped.is_none(),
                "coalesce {coalesce}, busy polling {busy_poll}, round {i}: answered without a round trip"
            );
            let d = b
                .try_acquire("fresh", &fresh, Cost::default())
                .await
                .unwrap();
            assert!(d.allowed, "round {i}: got the dropped call's denial");
            let d = b
                .try_acquire("spent", &spent, Cost::default())
                .await
                .unwrap();
            assert!(!d.allowed, "round {i}: got another call's reply");
            // Time to open the direct connection again, so that the next
            // round's dropped call goes through it.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Backends on one server and one manual clock, each under its own prefix:
/// built with the defaults (busy polling on), with `busy_poll` off, and
/// with a budget too short for any reply (every poll a miss, so the guard
/// backs off and skips polls).
async fn backends(server: &RedisServer, clock: &ManualClock) -> Vec<RedisBackend> {
    let mut out = Vec::new();
    for (prefix, budget) in [
        ("default", None),
        ("off", Some(Duration::ZERO)),
        ("misses", Some(Duration::from_nanos(1))),
    ] {
        let mut builder = RedisBackend::builder(&server.url())
            .prefix(prefix)
            .client_time(Arc::new(clock.clone()));
        if let Some(budget) = budget {
            builder = builder.busy_poll(budget);
        }
        out.push(builder.connect().await.expect("connect"));
    }
    out
}

#[tokio::test]
async fn busy_polling_on_by_default_gives_the_answers_of_polling_off() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000);
    let backends = backends(&server, &clock).await;
    let limits = Limits::new().rate(RateLimit::per_second(10).with_burst(5));
    let spec = LimitSpec::new(&limits, Duration::from_secs(30));
    let (mut allowed, mut denied) = (0, 0);
    // Lone calls: one at a time, each backend in turn at the same instant.
    for i in 0u64..300 {
        let cost = Cost::requests(1 + i % 3);
        let mut answers = Vec::new();
        for b in &backends {
            answers.push(b.try_acquire("k", &spec, cost).await.expect("answered"));
        }
        assert!(
            answers.iter().all(|d| *d == answers[0]),
            "call {i}: {answers:?}"
        );
        if answers[0].allowed {
            allowed += 1;
        } else {
            denied += 1;
        }
        let mut reservations = Vec::new();
        for b in &backends {
            reservations.push(
                b.reserve("r", &spec, cost, Duration::from_secs(1))
                    .await
                    .expect("answered"),
            );
        }
        assert!(
            reservations.iter().all(|r| *r == reservations[0]),
            "reserve {i}: {reservations:?}"
        );
        clock.advance(Duration::from_micros(20_000 + (i * 7_919) % 150_000));
    }
    assert!(
        allowed > 0 && denied > 0,
        "{allowed} allowed, {denied} denied"
    );
    // Many calls in flight at one instant: each backend admits exactly its
    // burst.
    clock.advance(Duration::from_secs(10));
    for b in &backends {
        let calls = (0..40).map(|_| b.try_acquire("burst", &spec, Cost::default()));
        let answers = futures::future::join_all(calls).await;
        let admitted = answers
            .into_iter()
            .map(|d| d.expect("answered"))
            .filter(|d| d.allowed)
            .count();
        assert_eq!(admitted, 5);
    }
    // The states left behind are the same.
    for key in ["k", "r", "burst"] {
        let states: Vec<_> = futures::future::join_all(backends.iter().map(|b| b.state(key)))
            .await
            .into_iter()
            .map(|s| s.expect("state").expect("a state"))
            .collect();
        assert!(states.iter().all(|s| *s == states[0]), "{key}: {states:?}");
    }
}

/// A TCP proxy to Redis on `upstream` that passes the first connection
/// (the shared one) and holds every later one (the direct connection) open
/// without passing a byte: a server that stops answering on it.
async fn silent_after_first(upstream: u16) -> u16 {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut client, _)) = listener.accept().await {
            if !std::mem::take(&mut first) {
                tokio::spawn(async move {
                    let mut sink = vec![0u8; 4096];
                    while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
                });
                continue;
            }
            let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
            else {
                continue;
            };
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    port
}

/// The calls that are not decisions (the `maxmemory-policy` check of
/// `connect`, `state`) get the response timeout too when they go through
/// the direct connection: before, they waited for a reply forever, so
/// `connect` hung on a server that stopped answering.
#[tokio::test]
async fn calls_that_are_not_decisions_do_not_wait_forever() {
    let server = RedisServer::start();
    let port = silent_after_first(server.port()).await;
    let backend = tokio::time::timeout(
        Duration::from_secs(20),
        RedisBackend::builder(&format!("redis://127.0.0.1:{port}/"))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300))
            .connect(),
    )
    .await
    .expect("connect returns")
    .expect("connected (the policy check is skipped)");
    let state = tokio::time::timeout(Duration::from_secs(20), backend.state("k")).await;
    assert!(state.is_ok(), "state returns");
}
