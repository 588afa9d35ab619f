//! Faults of one node of a real 3-node Redis Cluster: a frozen (SIGSTOP)
//! node leaves the keys of the other nodes to Redis, its own to the
//! failure policy. Every test starts its own cluster (with
//! `cluster-require-full-coverage no`, so that the other nodes serve their
//! slots once the frozen one is marked failed) and runs in real time (the
//! cluster client's timeouts do not run on tokio's paused clock); the
//! buckets run on a client clock that never moves, so no refill blurs a
//! count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::{Cost, Decision, LimitSpec, Limits, ManualClock, RateLimit, Store};
use broker_core::{Failover, FailurePolicy};
use broker_redis::{RedisBackend, RedisBackendBuilder};
use broker_testkit::RedisCluster;

/// A cluster of 3 masters whose healthy nodes go on serving their slots
/// while one is down.
fn cluster() -> RedisCluster {
    RedisCluster::start_with(3, &["--cluster-require-full-coverage", "no"])
}

/// A backend builder on `cluster` under `policy` whose calls give up after
/// 150 ms (a connection included), on `clock`.
fn builder(cluster: &RedisCluster, prefix: &str, clock: &Arc<ManualClock>) -> RedisBackendBuilder {
    let urls = cluster.urls();
    RedisBackend::builder(&urls[0])
        .cluster(urls)
        .prefix(prefix)
        .client_time(clock.clone())
        .connect_timeout(Duration::from_millis(150))
        .response_timeout(Duration::from_millis(150))
}

async fn connect(b: RedisBackendBuilder, policy: FailurePolicy) -> Failover<RedisBackend> {
    b.connect_with_policy(policy)
        .await
        .expect("connect to the cluster")
}

/// A resource whose keys (on `backend`) live on node `node`.
fn resource_on(cluster: &RedisCluster, backend: &RedisBackend, node: usize) -> String {
    (0..)
        .map(|i| format!("r{i}"))
        .find(|r| cluster.node_of(&backend.bucket_key(r).unwrap()) == node)
        .expect("some resource hashes to every node")
}

/// `n` resources whose keys (on `backend`) live on node `node`, each in a
/// hash slot of its own.
fn resources_on_slots(
    cluster: &RedisCluster,
    backend: &RedisBackend,
    node: usize,
    n: usize,
) -> Vec<String> {
    let mut slots = std::collections::HashSet::new();
    (0..)
        .map(|i| format!("f{i}"))
        .filter(|r| {
            let key = backend.bucket_key(r).unwrap();
            cluster.node_of(&key) == node && slots.insert(cluster.slot_of(&key))
        })
        .take(n)
        .collect()
}

/// `n` per minute, with a burst of `n`.
fn per_minute(n: u64) -> LimitSpec {
    LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(n)),
        Duration::from_secs(60),
    )
}

/// A `try_acquire` that takes nothing: loads the scripts on the key's
/// node and opens the connection to it.
async fn warm(backend: &Failover<RedisBackend>, key: &str, spec: &LimitSpec) {
    let d = backend.try_acquire(key, spec, Cost::requests(0)).await;
    assert!(d.expect("warm-up answered by redis").allowed);
}

/// The tokens of `key`'s first bucket as stored, once what a late
/// decision took has had time to come back (at most 5 s): `None` when the
/// state is fresh (a full bucket).
async fn tokens_settled(backend: &RedisBackend, key: &str, full: f64) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = backend.state(key).await.expect("the key's node answers");
        let tokens = state.and_then(|s| s.buckets.first().map(|b| b.tokens));
        if tokens.is_none_or(|t| t >= full) || Instant::now() > deadline {
            return tokens;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One node of three frozen, then another killed: the keys of its slots
/// are answered by the failure policy (here fail-open), and the keys of
/// the other nodes are still decided by Redis, shared with a second
/// backend: a limit of 4 admits exactly 4 of 10 calls spread over both.
/// Before, the first failure on the down node put the whole backend in an
/// outage: its calls on a healthy key were let through by fail-open too,
/// counted nowhere, as if every node were down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_node_leaves_the_keys_of_the_other_nodes_to_redis() {
    let mut cluster = cluster();
    one_node_down(&mut cluster, "frozen", 1).await;
    cluster.nodes()[1].resume();
    one_node_down(&mut cluster, "killed", 2).await;
}

/// Takes node `down` out (`"frozen"`: SIGSTOP; `"killed"`: SIGKILL) and
/// checks that only its key is answered by the policy (see
/// [`a_down_node_leaves_the_keys_of_the_other_nodes_to_redis`]).
async fn one_node_down(cluster: &mut RedisCluster, fault: &str, down: usize) {
    let clock = Arc::new(ManualClock::new());
    let policy = FailurePolicy::FailOpen;
    let a = connect(builder(cluster, fault, &clock), policy.clone()).await;
    let b = connect(builder(cluster, fault, &clock), policy).await;
    let live = resource_on(cluster, a.primary(), 0);
    let dead = resource_on(cluster, a.primary(), down);
    let spec = per_minute(4);
    for backend in [&a, &b] {
        warm(backend, &live, &spec).await;
        warm(backend, &dead, &spec).await;
    }

    match fault {
        "frozen" => cluster.nodes()[down].pause(),
        _ => cluster.node_mut(down).kill(),
    }
    let one = Cost::default();
    let by_policy = |d: &Decision| d.allowed && d.answered_here;
    let d = a.try_acquire(&dead, &spec, one).await.expect("fail-open");
    assert!(by_policy(&d), "{fault}: the down node's key: {d:?}");
    assert!(
        a.health().down,
        "{fault}: an outage of the down node's slot"
    );
    let mut admitted = 0;
    for i in 0..10 {
        let backend = if i % 2 == 0 { &a } else { &b };
        let d = backend.try_acquire(&live, &spec, one).await.unwrap();
        assert!(
            !d.answered_here,
            "{fault}: call {i} on a healthy node's key: {d:?}"
        );
        admitted += usize::from(d.allowed);
    }
    assert_eq!(admitted, 4, "{fault}: a limit of 4 across both backends");
    // The down node's slot is still out: answered at once, until a probe.
    let d = a.try_acquire(&dead, &spec, one).await.expect("fail-open");
    assert!(by_policy(&d), "{fault}: the down node's key again: {d:?}");
}

/// A key whose node lost its scripts (`SCRIPT FLUSH`, a restart) while
/// another node is frozen: its `NOSCRIPT` loads the script on its own node
/// only, and the call is decided by Redis. Before, the script was loaded
/// on every primary, the load waited for the frozen one, and the call was
/// refused (fail-closed) as if its own node were out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noscript_loads_the_script_on_the_keys_node_only() {
    let cluster = cluster();
    let clock = Arc::new(ManualClock::new());
    let policy = FailurePolicy::FailClosed;
    let backend = connect(builder(&cluster, "noscript", &clock), policy).await;
    let live = resource_on(&cluster, backend.primary(), 0);
    let spec = per_minute(4);
    warm(&backend, &live, &spec).await;

    cluster.nodes()[2].pause();
    for node in &cluster.nodes()[..2] {
        assert_eq!(node.command("SCRIPT FLUSH"), "+OK");
    }
    let d = backend.try_acquire(&live, &spec, Cost::default()).await;
    let d = d.expect("decided by redis on the key's own node");
    assert!(d.allowed && !d.answered_here, "{d:?}");
    assert!(!backend.health().down);
    cluster.nodes()[2].resume();
}

/// A decision whose node freezes gets no reply within the operation
/// timeout and is refused by the failure policy (fail-closed); the node
/// runs it once it resumes, after that timeout and well within the wait
/// for a late reply, and what it took is given back, alone, in a batch
/// and with coalescing off, as on one server. Before, the cluster's
/// client gave up on the reply at its own response timeout (shorter than
/// the operation timeout), so the late reply was never read and Redis kept
/// the cost of a refused call (a 2-per-minute limit lost one of its two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reply_on_a_cluster_gives_its_cost_back() {
    let cluster = cluster();
    let clock = Arc::new(ManualClock::new());
    let spec = per_minute(2);
    for mode in ["alone", "batch", "off"] {
        let b = builder(&cluster, &format!("late{mode}"), &clock);
        let backend = connect(
            match mode {
                "alone" => b,
                "batch" => b.coalesce_every_call(),
                _ => b.coalesce(false),
            },
            FailurePolicy::FailClosed,
        )
        .await;
        let key = resource_on(&cluster, backend.primary(), 1);
        warm(&backend, &key, &spec).await;

        cluster.nodes()[1].pause();
        let told = backend.try_acquire(&key, &spec, Cost::default()).await;
        assert!(told.is_err(), "{mode}: refused by the policy ({told:?})");
        cluster.nodes()[1].resume();
        let tokens = tokens_settled(backend.primary(), &key, 2.0).await;
        assert!(
            tokens.is_none_or(|t| t >= 2.0),
            "{mode}: told {told:?}, yet Redis kept the cost: {tokens:?} tokens left"
        );
    }
}

/// Decisions on other slots, made while a call on a frozen node is in
/// flight (one call in flight at a time per slot), are decided by Redis:
/// only the frozen slot's decisions are answered by the failure policy.
/// Alone (the call in flight is a lone decision) and in batches. Before,
/// they queued behind that call, and every queued decision was refused
/// (fail-closed) with it when it timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_a_frozen_node_drops_only_its_slots_queued_decisions() {
    let cluster = cluster();
    let clock = Arc::new(ManualClock::new());
    let spec = per_minute(10);
    for mode in ["alone", "batch"] {
        let b = builder(&cluster, &format!("queued{mode}"), &clock).coalesce_limits(32, 1);
        let backend = connect(
            match mode {
                "alone" => b,
                _ => b.coalesce_every_call(),
            },
            FailurePolicy::FailClosed,
        )
        .await;
        let live = resource_on(&cluster, backend.primary(), 0);
        let dead = resource_on(&cluster, backend.primary(), 1);
        // Three at once: the lone one's script and the batch script (the
        // two behind it) are loaded on both nodes.
        for key in [&live, &dead] {
            futures::future::join_all((0..3).map(|_| warm(&backend, key, &spec))).await;
        }

        cluster.nodes()[1].pause();
        let one = Cost::default();
        // The frozen node's decision goes first (polled first, it takes
        // the one place in flight); the others queue behind it.
        let (stuck, queued) = tokio::join!(
            backend.try_acquire(&dead, &spec, one),
            futures::future::join_all((0..3).map(|_| backend.try_acquire(&live, &spec, one))),
        );
        assert!(stuck.is_err(), "{mode}: the frozen node's key: {stuck:?}");
        for d in queued {
            let d = d.unwrap_or_else(|e| panic!("{mode}: a healthy node's key refused: {e}"));
            assert!(d.allowed && !d.answered_here, "{mode}: {d:?}");
        }
        cluster.nodes()[1].resume();
    }
}

/// A slot that went down while its node was frozen reads up again once
/// the node is back, though its key is never used again: a call that
/// reaches Redis on another slot probes the down slot (a `PING` to its
/// node, once per probe interval). Before, only a call on that slot could
/// end its outage, so the backend's health read down for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_slot_reads_up_again_once_its_node_is_back() {
    let cluster = cluster();
    let clock = Arc::new(ManualClock::new());
    let policy = FailurePolicy::FailOpen;
    let b = builder(&cluster, "recover", &clock).probe_interval(Duration::from_millis(50));
    let backend = connect(b, policy).await;
    let live = resource_on(&cluster, backend.primary(), 0);
    let dead = resource_on(&cluster, backend.primary(), 1);
    let spec = per_minute(1_000_000);
    warm(&backend, &live, &spec).await;
    warm(&backend, &dead, &spec).await;

    cluster.nodes()[1].pause();
    let d = backend.try_acquire(&dead, &spec, Cost::default()).await;
    assert!(d.expect("fail-open").answered_here);
    assert!(backend.health().down, "the frozen node's slot is down");
    cluster.nodes()[1].resume();

    // Calls on the live key only, for up to 5 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.health().down && Instant::now() < deadline {
        let d = backend.try_acquire(&live, &spec, Cost::default()).await;
        assert!(!d.expect("the live node answers").answered_here);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let health = backend.health();
    assert!(!health.down, "every node answers again: {health:?}");
    assert_eq!(health.outages, 1, "{health:?}");
}

/// Five decisions on five slots of a frozen node, each waiting for its
/// reply, and then one on a healthy node's key: that one is sent at once
/// and answered by Redis while the five still wait. The coalescer's places
/// in flight are per slot. Before, they were shared by every node: the
/// five took them all (five by default), and the healthy decision queued
/// behind them until one timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_holds_up_no_decision_on_another() {
    let cluster = cluster();
    let clock = Arc::new(ManualClock::new());
    // A long wait for a reply: the frozen node's calls are still waiting
    // when the healthy one is answered, however slow the machine.
    let b = builder(&cluster, "places", &clock).response_timeout(Duration::from_secs(20));
    let backend = Arc::new(connect(b, FailurePolicy::FailOpen).await);
    let live = resource_on(&cluster, backend.primary(), 0);
    let frozen = resources_on_slots(&cluster, backend.primary(), 1, 5);
    let spec = per_minute(1_000_000);
    warm(&backend, &live, &spec).await;
    for key in &frozen {
        warm(&backend, key, &spec).await;
    }

    cluster.nodes()[1].pause();
    let waiting: Vec<_> = frozen
        .iter()
        .map(|key| {
            let (backend, key, spec) = (backend.clone(), key.clone(), spec.clone());
            tokio::spawn(async move { backend.try_acquire(&key, &spec, Cost::default()).await })
        })
        .collect();
    // Sent: each waits for its reply.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let d = backend.try_acquire(&live, &spec, Cost::default()).await;
    assert!(!d.expect("the healthy node answers").answered_here);
    let answered = waiting.iter().filter(|t| t.is_finished()).count();
    assert_eq!(answered, 0, "the healthy decision waited for a frozen one");

    cluster.nodes()[1].resume();
    for task in waiting {
        let d = task.await.unwrap().expect("answered once the node is back");
        assert!(!d.answered_here, "the node answered within its wait");
    }
}

/// One node's failure logs one error, not one per slot in use: five keys
/// on five slots of a frozen node each start an outage of their own
/// (counted each), but only the first is logged at error level, the
/// others at debug level; once the node is back, one line at info level
/// says the last slot down is reachable again. On one thread (a
/// current-thread runtime), where the log is captured.
#[tokio::test]
async fn a_frozen_node_logs_one_error_for_all_its_slots() {
    let (logs, _guard) = broker_testkit::capture_logs(tracing::Level::DEBUG);
    let cluster = cluster();
    let clock = Arc::new(ManualClock::new());
    let b = builder(&cluster, "logs", &clock).probe_interval(Duration::from_millis(50));
    let backend = connect(b, FailurePolicy::FailOpen).await;
    let frozen = resources_on_slots(&cluster, backend.primary(), 1, 5);
    let spec = per_minute(1_000_000);
    for key in &frozen {
        warm(&backend, key, &spec).await;
    }

    cluster.nodes()[1].pause();
    for key in &frozen {
        let d = backend.try_acquire(key, &spec, Cost::default()).await;
        assert!(d.expect("fail-open").answered_here);
    }
    assert_eq!(backend.health().outages, 5, "{:?}", backend.health());
    cluster.nodes()[1].resume();
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.health().down && Instant::now() < deadline {
        let _ = backend
            .try_acquire(&frozen[0], &spec, Cost::default())
            .await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!backend.health().down, "{:?}", backend.health());

    let unreachable = "redis cluster slot unreachable";
    assert_eq!(logs.count("ERROR", unreachable), 1);
    assert_eq!(logs.count("DEBUG", unreachable), 4);
    let last_back = "reachable again, the last one down";
    assert_eq!(logs.count("INFO", last_back), 1);
    assert_eq!(logs.count("DEBUG", "redis cluster slot reachable again"), 4);
}
