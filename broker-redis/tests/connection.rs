//! The connection (the `redis` crate's connection manager): it says what
//! the URL asks for first, a call dropped before its reply never hands that
//! reply to the next call, and no call waits for a silent server forever.

use std::time::Duration;

use broker_core::{Cost, LimitSpec, Limits, RateLimit, Store};
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
    for coalesce in [true, false] {
        let b = RedisBackend::builder(&server.url())
            .prefix(format!("c{coalesce}"))
            .coalesce(coalesce)
            .connect()
            .await
            .expect("connect");
        let (spent, fresh) = (spec(1), spec(1_000_000));
        assert!(
            b.try_acquire("spent", &spent, Cost::default())
                .await
                .unwrap()
                .allowed
        );
        for i in 0..20 {
            // Written, then dropped while its reply (a denial) is on its way
            // (the server is paused meanwhile).
            server.pause();
            let dropped = b
                .try_acquire("spent", &spent, Cost::default())
                .now_or_never();
            server.resume();
            assert!(
                dropped.is_none(),
                "coalesce {coalesce}, round {i}: answered without a round trip"
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
        }
    }
}

/// A TCP proxy to Redis on `upstream` that passes the first connection
/// and holds every later one open without passing a byte: a server that
/// stops answering on a new connection.
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
/// `connect`, `state`) get the response timeout too: `connect` never
/// hangs on a server that stops answering.
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
