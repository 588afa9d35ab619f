//! The shared turn ledger (`lua/turn.lua`) on a real server, in the
//! client's manual time: weights split the turns, a flow away for its
//! active window or done with its last waiter holds nobody back, a flow
//! joining starts level with the others, and its keys expire.

use std::sync::Arc;
use std::time::Duration;

use broker_core::store::{Turn, TurnAsk};
use broker_core::{ManualClock, Store};
use broker_redis::RedisBackend;
use broker_testkit::RedisServer;

/// One token interval, µs.
const UNITS: u64 = 100_000;

async fn backend(server: &RedisServer, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(&server.url())
        .client_time(Arc::new(clock.clone()))
        .connect()
        .await
        .unwrap()
}

fn ask(flow: &str, weight: u32) -> TurnAsk<'_> {
    TurnAsk {
        level: 1,
        flow,
        weight,
        units: UNITS,
        last: false,
        active: Duration::from_secs(1),
    }
}

/// Asks for `flow`'s turn on state "api".
async fn turn(b: &RedisBackend, ask: TurnAsk<'_>) -> Turn {
    b.turns()
        .expect("a ledger")
        .turn("api", &ask)
        .await
        .unwrap()
}

#[tokio::test]
async fn weights_three_to_one_split_the_turns_three_to_one() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000);
    let b = backend(&server, &clock).await;
    // Both ask in turn, as two backlogged processes do.
    let mut granted = (0, 0);
    for _ in 0..400 {
        if turn(&b, ask("a", 3)).await == Turn::Yours {
            granted.0 += 1;
        }
        if turn(&b, ask("b", 1)).await == Turn::Yours {
            granted.1 += 1;
        }
        clock.advance(Duration::from_millis(1));
    }
    let (a, bb) = granted;
    // A flow is at most one quantum ahead of the least, and charged one
    // more when granted: two of B's quanta, six of A's.
    assert!((a as i64 - 3 * bb as i64).abs() <= 6, "A {a}, B {bb}");
    assert!(bb >= 90, "B {bb}");
}

#[tokio::test]
async fn a_flow_gone_quiet_or_done_holds_nobody_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000);
    let b = backend(&server, &clock).await;
    assert_eq!(turn(&b, ask("b", 1)).await, Turn::Yours);
    // A is held one quantum past B, while B is active.
    let mut a_turns = 0;
    while turn(&b, ask("a", 1)).await == Turn::Yours {
        a_turns += 1;
        assert!(a_turns < 10, "A never held back");
    }
    assert_eq!(a_turns, 2);
    // B not seen for its active window: it has left.
    clock.advance(Duration::from_micros(1_000_001));
    assert_eq!(turn(&b, ask("a", 1)).await, Turn::Yours);
    // B's last waiter served: B stays one token interval, holding A one
    // quantum past it, then leaves.
    let last = TurnAsk {
        last: true,
        ..ask("b", 1)
    };
    assert_eq!(turn(&b, last).await, Turn::Yours);
    let mut a_turns = 0;
    while turn(&b, ask("a", 1)).await == Turn::Yours {
        a_turns += 1;
        assert!(a_turns < 10, "A never held back");
    }
    assert_eq!(a_turns, 3);
    clock.advance(Duration::from_micros(UNITS + 1));
    for _ in 0..5 {
        assert_eq!(turn(&b, ask("a", 1)).await, Turn::Yours);
    }
}

#[tokio::test]
async fn a_joining_flow_starts_level_with_the_active_ones() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000);
    let b = backend(&server, &clock).await;
    for _ in 0..50 {
        assert_eq!(turn(&b, ask("a", 1)).await, Turn::Yours);
    }
    // B, new, gets no backlog of 50 turns: A and B alternate at once.
    let mut order = String::new();
    for _ in 0..6 {
        for flow in ["a", "b"] {
            if turn(&b, ask(flow, 1)).await == Turn::Yours {
                order.push_str(flow);
            }
        }
    }
    assert_eq!(order.matches('b').count(), 6, "{order}");
    assert!(order.matches('a').count() >= 5, "{order}");
}

#[tokio::test]
async fn the_ledgers_keys_expire_and_sit_on_the_states_hash_tag() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000);
    let b = backend(&server, &clock).await;
    assert_eq!(turn(&b, ask("a", 1)).await, Turn::Yours);
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    for key in ["rb:{api}:t1v", "rb:{api}:t1s"] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap();
        // The active window (1 s) plus the TTL margin (1 s).
        assert!(ttl > 1_000 && ttl <= 2_000, "{key}: {ttl}");
    }
}
