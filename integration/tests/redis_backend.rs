//! RedisBackend behaviour that has no in-memory counterpart: one round trip
//! per decision, script reload after a flush, key TTLs from the state, the
//! server's clock shared by replicas, clamping of a lagging client clock,
//! and the startup check of `maxmemory-policy`.

use std::sync::Arc;
use std::time::Duration;

use broker_core::{Clock, Cost, LimitSpec, Limits, ManualClock, RateLimit, ResourceBroker, Store};
use broker_redis::RedisBackend;
use broker_testkit::{command_calls, RedisServer};
use futures::FutureExt;

/// Whether one `try` of cost 1 on `key` is allowed.
async fn allowed(backend: &RedisBackend, key: &str, spec: &LimitSpec) -> bool {
    backend
        .try_acquire(key, spec, Cost::default())
        .await
        .unwrap()
        .allowed
}

/// A backend on `server` that takes its time from `clock`, with no margin
/// added to its keys' time to live.
async fn on_client_time(server: &RedisServer, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(&server.url())
        .client_time(Arc::new(clock.clone()))
        .ttl_margin(Duration::ZERO)
        .connect()
        .await
        .unwrap()
}

fn seed_spec() -> LimitSpec {
    let limits = Limits::new().rate(RateLimit::per(2, Duration::from_secs(1)).with_burst(3));
    LimitSpec::new(&limits, Duration::from_secs(30))
}

/// Commands named in `INFO commandstats` (scripts' own calls included).
fn commands(stats: &str) -> Vec<String> {
    stats
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// What the scripts call inside Redis (counted in commandstats too).
const INSIDE_SCRIPTS: &[&str] = &[
    "time",
    "hmget",
    "hset",
    "pexpire",
    "del",
    "zremrangebyscore",
    "zcard",
    "zadd",
    "zrange",
    "zrem",
    "zscore",
];

#[tokio::test]
async fn every_decision_is_exactly_one_evalsha() {
    let server = RedisServer::start();
    let broker = ResourceBroker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let limits = Limits::new()
        .rate(RateLimit::per_second(1000))
        .rate(RateLimit::per_minute(100_000).unit(broker_core::Unit::Tokens))
        .max_concurrent(50);
    broker.register_limit("api", limits).unwrap();
    // Warm up: the first call loads the script (NOSCRIPT, SCRIPT LOAD, EVALSHA).
    let warm = broker.try_acquire("api", Cost::tokens(1)).await.unwrap();
    server.command("CONFIG RESETSTAT");
    let mut permits = Vec::new();
    for _ in 0..40 {
        let a = broker.try_acquire("api", Cost::tokens(10)).await.unwrap();
        assert!(a.allowed);
        permits.push(a.permit);
    }
    let stats = server.command("INFO commandstats");
    assert_eq!(command_calls(&stats, "evalsha"), 40, "{stats}");
    assert_eq!(
        command_calls(&stats, "time"),
        40,
        "one script run per decision: {stats}"
    );
    assert_eq!(
        command_calls(&stats, "hmget"),
        40,
        "one script run per decision: {stats}"
    );
    for command in commands(&stats) {
        assert!(
            command == "evalsha"
                || command == "config|resetstat"
                || INSIDE_SCRIPTS.contains(&command.as_str()),
            "{command} sent on the hot path: {stats}"
        );
    }
    drop((warm, permits));
}

#[tokio::test]
async fn scripts_are_reloaded_after_a_script_flush() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let spec = seed_spec();
    assert!(allowed(&backend, "k", &spec).await);
    assert!(server.command("SCRIPT FLUSH").contains("OK"));
    assert!(allowed(&backend, "k", &spec).await);
    let d = backend
        .try_acquire("k", &spec, Cost::default())
        .await
        .unwrap();
    let d4 = backend
        .try_acquire("k", &spec, Cost::default())
        .await
        .unwrap();
    assert!(d.allowed && !d4.allowed, "the state survived the reload");
}

#[tokio::test]
async fn a_penalty_keeps_the_key_until_it_ends_and_an_idle_key_is_deleted() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let backend = on_client_time(&server, &clock).await;
    let spec = seed_spec();
    let key = backend.bucket_key("p").unwrap();
    assert_eq!(key, "rb:{p}:b");
    backend
        .try_acquire("p", &spec, Cost::default())
        .await
        .unwrap();
    let ttl_ms = server.pttl(&key);
    assert!(
        (1..=500).contains(&ttl_ms),
        "one token short: refilled within 0.5 s, got {ttl_ms}"
    );
    backend
        .penalize("p", &spec, Duration::from_secs(120))
        .await
        .unwrap();
    let ttl_ms = server.pttl(&key);
    assert!(
        ttl_ms > 119_000,
        "the key lives as long as the penalty, got {ttl_ms} ms"
    );
    clock.advance(Duration::from_secs(121));
    backend
        .settle("p", &spec, Cost::requests(0), Cost::requests(0), None)
        .await
        .unwrap();
    assert_eq!(
        server.command(&format!("EXISTS {key}")),
        ":0",
        "an idle bucket is deleted"
    );
}

/// A resource with a concurrency limit alone has no bucket to hold: its
/// penalty is the hash's `hold` field, and the hash lives until the
/// penalty ends, then is deleted by the first call after.
#[tokio::test]
async fn a_penalty_on_a_concurrency_limit_alone_keeps_its_key_until_it_ends() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let backend = on_client_time(&server, &clock).await;
    let spec = LimitSpec::new(&Limits::new().max_concurrent(2), Duration::from_secs(5));
    let key = backend.bucket_key("c").unwrap();
    backend
        .penalize("c", &spec, Duration::from_secs(7200))
        .await
        .unwrap();
    let ttl_ms = server.pttl(&key);
    assert!(
        ttl_ms > 7_199_000,
        "the key lives as long as the penalty, got {ttl_ms} ms"
    );
    let state = backend.state("c").await.unwrap().unwrap();
    assert_eq!(
        (state.buckets.len(), state.penalty),
        (0, clock.now() + 7_200_000_000)
    );
    clock.advance(Duration::from_secs(7200));
    assert!(
        backend
            .try_acquire("c", &spec, Cost::default())
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(
        server.command(&format!("EXISTS {key}")),
        ":0",
        "a penalty that has ended is deleted"
    );
}

#[tokio::test]
async fn replicas_share_the_servers_clock() {
    let server = RedisServer::start();
    let a = RedisBackend::connect(&server.url()).await.unwrap();
    let b = RedisBackend::connect(&server.url()).await.unwrap();
    let spec = seed_spec();
    for _ in 0..3 {
        assert!(allowed(&a, "shared", &spec).await);
    }
    let d = b
        .try_acquire("shared", &spec, Cost::default())
        .await
        .unwrap();
    assert!(!d.allowed);
    assert!(
        d.wait > 0 && d.wait <= 500_000,
        "wait {} on the server's clock",
        d.wait
    );
}

/// Two replicas on `server` in client-time mode: one whose clock reads
/// 10 s, and one whose clock lags it by 5 s.
async fn ahead_and_behind(server: &RedisServer) -> (RedisBackend, RedisBackend) {
    let at = |us: u64| {
        let clock = ManualClock::new();
        clock.set(us);
        RedisBackend::builder(&server.url())
            .client_time(Arc::new(clock))
            .connect()
    };
    (at(10_000_000).await.unwrap(), at(5_000_000).await.unwrap())
}

#[tokio::test]
async fn a_lagging_client_clock_never_runs_a_bucket_backwards() {
    let server = RedisServer::start();
    let (a, b) = ahead_and_behind(&server).await;
    let spec = seed_spec();
    for _ in 0..3 {
        assert!(allowed(&a, "k", &spec).await);
    }
    let d = b.try_acquire("k", &spec, Cost::default()).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(
        d.wait, 500_000,
        "measured from the bucket's ts, not 5 s back"
    );
    let state = a.state("k").await.unwrap().unwrap();
    assert_eq!(state.buckets[0].ts, 10_000_000);
}

/// A penalty put on by a replica whose clock lags the bucket's `ts` (clamped
/// to it) lasts as long from the bucket's time as the replica asked from
/// its own: a 429's penalty, and an upstream counter reported out until its
/// reset. Measured from the lagging clock, both would have ended 5 s before
/// the bucket's now, for every replica.
#[tokio::test]
async fn a_lagging_client_clock_does_not_shorten_a_penalty() {
    let server = RedisServer::start();
    let (a, b) = ahead_and_behind(&server).await;
    // 1,000 a second: a drained bucket refills one in 1 ms.
    let limits = Limits::new().rate(RateLimit::per_second(1000).with_burst(10));
    let spec = LimitSpec::new(&limits, Duration::from_secs(30));
    assert!(allowed(&a, "penalized", &spec).await, "ts = 10 s");
    b.penalize("penalized", &spec, Duration::from_secs(2))
        .await
        .unwrap();
    for (replica, clock) in [("ahead", &a), ("behind", &b)] {
        let d = clock
            .try_acquire("penalized", &spec, Cost::default())
            .await
            .unwrap();
        assert_eq!(
            (d.allowed, d.wait),
            (false, 2_000_000),
            "the replica {replica}: held 2 s from the bucket's now"
        );
    }
    assert!(allowed(&a, "reported", &spec).await, "ts = 10 s");
    let out = broker_core::ObservedLimit {
        requests: Some(broker_core::Observed {
            limit: Some(10),
            remaining: Some(0),
            reset: Some(Duration::from_secs(2)),
            ..Default::default()
        }),
        ..Default::default()
    };
    b.reconcile("reported", &spec, &out).await.unwrap();
    let d = a
        .try_acquire("reported", &spec, Cost::default())
        .await
        .unwrap();
    assert_eq!(
        (d.allowed, d.wait),
        (false, 2_000_000),
        "out until 2 s from the bucket's now"
    );
}

#[tokio::test]
async fn an_evicting_policy_is_flagged_at_connect() {
    // volatile-* too: every key of the broker has a TTL.
    for policy in ["allkeys-lru", "volatile-ttl", "volatile-lru"] {
        let risky = RedisServer::start_with(&["--maxmemory-policy", policy]);
        let backend = RedisBackend::connect(&risky.url()).await.unwrap();
        assert_eq!(backend.maxmemory_policy(), Some(policy));
        let risk = backend
            .maxmemory_policy()
            .is_some_and(|p| p != "noeviction");
        assert!(risk, "{policy}");
    }
    let safe = RedisServer::start();
    let backend = RedisBackend::connect(&safe.url()).await.unwrap();
    assert_eq!(backend.maxmemory_policy(), Some("noeviction"));
    let risk = backend
        .maxmemory_policy()
        .is_some_and(|p| p != "noeviction");
    assert!(!risk);
}

#[tokio::test]
async fn a_store_that_refuses_config_is_tolerated() {
    let server = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    assert_eq!(backend.maxmemory_policy(), None);
    let spec = seed_spec();
    assert!(allowed(&backend, "k", &spec).await);
}

#[tokio::test]
async fn a_prefix_with_a_brace_is_refused() {
    let server = RedisServer::start();
    let err = RedisBackend::builder(&server.url())
        .prefix("a{b")
        .connect()
        .await
        .expect_err("braces would move the hash tag");
    assert!(err.message.contains("prefix"), "{err}");
}

/// A broker on Redis with one concurrency slot on `r`, whose leases expire
/// after `ttl` unless renewed.
async fn one_slot(server: &RedisServer, ttl: Duration) -> ResourceBroker {
    let broker = ResourceBroker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let mut config = broker_core::ResourceConfig::new(Limits::new().max_concurrent(1));
    config.lease_ttl = ttl;
    broker.register("r", config).unwrap();
    broker
}

async fn slot_free(broker: &ResourceBroker) -> bool {
    broker
        .try_acquire("r", Cost::default())
        .await
        .unwrap()
        .allowed
}

/// Whether the slot of `r` is free within a second (asked every 10 ms).
async fn slot_free_soon(broker: &ResourceBroker) -> bool {
    for _ in 0..100 {
        if slot_free(broker).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// A permit dropped, then a decision at once from the same process: the
/// slot is free. The permit's release goes out from a task of its own, and
/// the decision sends it first rather than overtake it (a client sending
/// its requests one after another at a limit of 1 is never denied).
#[tokio::test]
async fn a_slot_released_here_is_free_to_the_next_decision_here() {
    let server = RedisServer::start();
    let broker = one_slot(&server, Duration::from_secs(30)).await;
    for i in 0..200 {
        let a = broker.try_acquire("r", Cost::default()).await.unwrap();
        assert!(a.allowed, "decision {i} found the slot held");
        drop(a);
    }
    // And the releases all landed: the slot is free, no lease is left.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let leases = server.command("KEYS *");
    assert!(slot_free(&broker).await, "{leases}");
}

/// A permit held for several lease TTLs keeps its slot: the broker renews
/// its lease while it lives (Redis's own clock runs in real time, so the
/// test waits in real time). Released, the slot is free again.
#[tokio::test]
async fn a_permit_held_past_the_lease_ttl_keeps_its_slot() {
    let server = RedisServer::start();
    let broker = one_slot(&server, Duration::from_millis(300)).await;
    let first = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed);
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!slot_free(&broker).await, "the slot is still the permit's");
    }
    drop(first);
    assert!(
        slot_free_soon(&broker).await,
        "the released slot is free again"
    );
}

/// Issue 39: a permit passed to `std::mem::forget` (never released) keeps
/// its slot for the resource's `max_hold` at most. Its lease is renewed
/// until then (it outlives three TTLs), then expires, and another broker on
/// the same Redis takes the slot (asked for up to 5 s; due by 1.8 s).
#[tokio::test]
async fn a_forgotten_permit_frees_its_slot_for_another_broker_after_max_hold() {
    let server = RedisServer::start();
    let config = broker_core::ResourceConfig {
        max_hold: Duration::from_millis(1500),
        ..broker_core::ResourceConfig::new(Limits::new().max_concurrent(1))
    };
    let on_server = || async {
        let broker = ResourceBroker::new(RedisBackend::connect(&server.url()).await.unwrap());
        let mut config = config.clone();
        config.lease_ttl = Duration::from_millis(300);
        broker.register("r", config).unwrap();
        broker
    };
    let (a, b) = (on_server().await, on_server().await);
    let forgotten = a.try_acquire("r", Cost::default()).await.unwrap();
    assert!(forgotten.allowed);
    std::mem::forget(forgotten);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!slot_free(&b).await, "renewed within max_hold");
    let mut freed = false;
    for _ in 0..500 {
        if slot_free(&b).await {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the forgotten permit's slot is free again");
}

/// A lease TTL the broker cannot renew in time is refused on Redis, where
/// leases expire: at 10 ms, a live permit's lease would expire as its
/// first renewal comes due, and a second holder would take the slot. The
/// in-memory store, where a lease ends only with its permit, takes it.
#[tokio::test]
async fn a_lease_ttl_too_short_to_renew_is_refused_on_redis() {
    let server = RedisServer::start();
    let broker = ResourceBroker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let config = |ms| {
        let mut config = broker_core::ResourceConfig::new(Limits::new().max_concurrent(1));
        config.lease_ttl = Duration::from_millis(ms);
        config
    };
    let err = broker.register("r", config(10)).unwrap_err().to_string();
    assert!(err.starts_with("leaseTtl: must be at least 30ms"), "{err}");
    assert!(broker.limits("r").is_err());
    let err = broker
        .register_limit("r", Limits::new().max_concurrent(1))
        .and_then(|()| broker.register("r", config(29)));
    assert!(err.is_err(), "a re-registration is checked too");
    broker.register("r", config(30)).unwrap();

    let in_memory = ResourceBroker::new(broker_memory::MemoryBackend::new());
    in_memory.register("r", config(10)).unwrap();
}

/// A live permit's lease lost with the store's data (a restart without
/// persistence) is taken again at a renewal once the store is back, while
/// its slot is free: the store counts the work running again, and another
/// broker is denied until the permit ends. (The store is watched, not
/// asked for the slot, so that no other holder takes it first.)
#[tokio::test]
async fn a_lease_lost_in_a_restart_is_taken_again() {
    let mut server = RedisServer::start();
    let holder = one_slot(&server, Duration::from_millis(300)).await;
    let other = one_slot(&server, Duration::from_millis(300)).await;
    let first = holder.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed);
    server.restart();
    assert_eq!(server.command("DBSIZE"), ":0", "the restart lost the lease");
    let mut back = false;
    for _ in 0..300 {
        back = server.command("DBSIZE") != ":0";
        if back {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back, "the lease is in the store again");
    // The other broker's connection learns of the restart with one error
    // (fail-closed), then reconnects.
    let mut answer = None;
    for _ in 0..100 {
        if let Ok(a) = other.try_acquire("r", Cost::default()).await {
            answer = Some(a.allowed);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(answer, Some(false), "the slot is the live permit's");
    drop(first);
    assert!(slot_free_soon(&other).await, "released, the slot is free");
}

/// A permit released while the renewal of its lease is on its way: the
/// renewal finds the lease gone, and the re-take that follows must not
/// leave it in the store with nobody holding it (the slot would be lost
/// to every caller until the lease's TTL ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_released_during_its_renewal_leaves_no_lease() {
    struct SlowRenewal;
    impl broker_testkit::Hooks for SlowRenewal {
        fn renew_delay(&self) -> Duration {
            Duration::from_millis(100)
        }
    }
    let server = RedisServer::start();
    let redis: Arc<dyn Store> = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let broker = ResourceBroker::new(broker_testkit::Wrapped::new(redis, SlowRenewal));
    let mut config = broker_core::ResourceConfig::new(Limits::new().max_concurrent(1));
    config.lease_ttl = Duration::from_millis(600);
    broker.register("r", config).unwrap();
    let held = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(held.allowed);
    // Renewed every 200 ms; released 50 ms into the first renewal's delay.
    tokio::time::sleep(Duration::from_millis(250)).await;
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.command("DBSIZE"), ":0", "no lease is left");
    assert!(slot_free(&broker).await);
}

/// The lease of a holder that died (its process gone, here its runtime
/// shut down with the permit never released) is no longer renewed and
/// expires after its TTL, and another broker takes the slot.
#[test]
fn the_lease_of_a_dead_holder_still_expires() {
    let server = RedisServer::start();
    let dying = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    dying.block_on(async {
        let broker = one_slot(&server, Duration::from_millis(300)).await;
        let held = broker.try_acquire("r", Cost::default()).await.unwrap();
        assert!(held.allowed);
        std::mem::forget(held);
    });
    drop(dying);
    let alive = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    alive.block_on(async {
        let broker = one_slot(&server, Duration::from_millis(300)).await;
        assert!(!slot_free(&broker).await, "the dead holder's lease is live");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(slot_free(&broker).await, "its lease expired unrenewed");
    });
}

/// The task that renews leases is lost with the runtime it ran on; the
/// next permit, on another runtime, starts another, and its lease is
/// renewed past its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_go_on_after_the_runtime_of_their_task_shut_down() {
    let server = RedisServer::start();
    let broker = one_slot(&server, Duration::from_millis(300)).await;
    let on_another = broker.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let held = on_another.try_acquire("r", Cost::default()).await.unwrap();
            assert!(held.allowed);
            // The renewing task starts on this runtime and waits.
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(held);
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        // Shut down while the task waits for its next renewal.
    })
    .join()
    .unwrap();
    let first = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed);
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!slot_free(&broker).await, "the slot is still the permit's");
    }
}

/// Two permits dropped, then a decision on their resource that goes away
/// after its first poll (a client that disconnects, a timeout around the
/// call): the decision took both releases from their tasks to send them
/// first, and sent only the first before it was dropped. The second must
/// still reach Redis; before, its task found it taken and sent nothing, so
/// the slot stayed held with no permit until the lease's TTL (30 s here).
#[tokio::test]
async fn a_decision_dropped_while_it_sends_the_releases_before_it_loses_none() {
    let server = RedisServer::start();
    let broker = ResourceBroker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let mut config = broker_core::ResourceConfig::new(Limits::new().max_concurrent(2));
    config.lease_ttl = Duration::from_secs(30);
    broker.register("r", config).unwrap();
    let first = broker.try_acquire("r", Cost::default()).await.unwrap();
    let second = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(first.allowed && second.allowed);
    // Their releases are handed to tasks, which have not run yet (one
    // thread, no await since).
    drop(first);
    drop(second);
    // Redis holds the first release's reply back, so the decision is
    // still sending it when it is dropped after its one poll.
    server.pause();
    assert!(broker
        .try_acquire("r", Cost::default())
        .now_or_never()
        .is_none());
    server.resume();
    // The release tasks run, and whatever was sent lands.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = server.command("ZCARD rb:{r}:l");
    assert_eq!(held, ":0", "a lease is left with no permit");
    let a = broker.try_acquire("r", Cost::default()).await.unwrap();
    let b = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(a.allowed && b.allowed, "both slots are free");
}

/// Two runtimes share a broker: the renewing task starts on the first
/// that makes a permit, and a permit made on the second meanwhile is
/// renewed by that task. When the first runtime shuts down, the second's
/// permit, still held, must go on being renewed on its own runtime; before,
/// nothing renewed it until another permit was made, its lease expired
/// after its TTL and another replica took its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_renewed_after_another_runtime_that_renewed_it_shut_down() {
    // A lease of 3 s, renewed every second: a renewal late by up to 2 s
    // on a loaded machine does not read as a missing one. Watched for two
    // TTLs after the first runtime shut down: unrenewed, the lease expires
    // within one.
    const TTL: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let broker = one_slot(&server, TTL).await;
    broker
        .register_limit("first", Limits::new().max_concurrent(1))
        .unwrap();
    let (made, has_made) = std::sync::mpsc::channel();
    let (go, goes) = std::sync::mpsc::channel::<()>();
    let on_another = broker.clone();
    let other = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            // The renewing task starts on this runtime.
            let held = on_another
                .try_acquire("first", Cost::default())
                .await
                .unwrap();
            assert!(held.allowed);
            made.send(()).unwrap();
            // Runs (and renews) until told to end.
            while goes.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(held);
        });
        // Shut down while the renewing task waits for its next renewal.
    });
    has_made.recv().unwrap();
    let held = broker.try_acquire("r", Cost::default()).await.unwrap();
    assert!(held.allowed);
    go.send(()).unwrap();
    other.join().unwrap();
    // Another replica, asking for the slot while the permit is held.
    let replica = one_slot(&server, TTL).await;
    for _ in 0..2 {
        tokio::time::sleep(TTL).await;
        assert!(
            !slot_free(&replica).await,
            "the held permit's lease expired unrenewed"
        );
    }
    drop(held);
    assert!(slot_free_soon(&replica).await, "released, the slot is free");
}
