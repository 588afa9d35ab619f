//! The direct connection (a call that finds it free writes and reads on its
//! own task): it says what the URL asks for first, and a call dropped
//! before its reply never hands that reply to the next call.

use std::time::Duration;

use broker_core::{Backend, Cost, LimitSpec, Limits, RateLimit};
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
            .prefix(if coalesce { "on" } else { "off" })
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
            // Written, then dropped while its reply (a denial) is on its way.
            let dropped = b
                .try_acquire("spent", &spent, Cost::default())
                .now_or_never();
            assert!(
                dropped.is_none(),
                "round {i}: answered without a round trip"
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
