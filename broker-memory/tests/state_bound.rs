//! The bound on the number of states: a flood of new keys keeps the store
//! within it, and a key dropped at the bound comes back with no more than
//! it had (no limit is multiplied by dropping its state).

mod bound_support;

use std::time::Duration;

use bound_support::{bounded, clock, hold, take, BOUND};
use broker_core::keys::keyed;
use broker_core::{Cost, Limits, LocalStore, ManualClock, RateLimit, ResourceBroker, Store};
use broker_memory::MemoryBackend;

/// One try each of `keys` new keys; how many were allowed.
fn flood(broker: &ResourceBroker, keys: usize) -> usize {
    (0..keys)
        .map(|i| take(broker, &format!("flood-{i}"), 1))
        .sum()
}

fn five_a_minute() -> Limits {
    Limits::new().rate(RateLimit::per_minute(5))
}

#[test]
fn a_flood_of_new_keys_stays_within_the_bound() {
    let clock = clock();
    let (backend, broker) = bounded(&clock);
    broker.register_limit("tenant", five_a_minute()).unwrap();
    let mut most = 0;
    for i in 0..10_000 {
        take(&broker, &format!("flood-{i}"), 1);
        most = most.max(backend.len());
    }
    // The resource's own state is pinned by its registration and kept.
    assert!(most <= BOUND + 1, "{most} states held at most");
    assert!(backend.folded() >= 10_000 - BOUND as u64);
}

/// A sweep that drops only idle states (one due on time, or a call of
/// `evict_idle`) while the store holds more than seven eighths of its
/// bound, none of them idle, leaves the next sweep due at the bound, not
/// an eighth past it: the flood that follows stays within the bound.
#[test]
fn a_flood_after_a_sweep_of_idle_states_stays_within_the_bound() {
    let clock = clock();
    let (backend, broker) = bounded(&clock);
    broker.register_limit("tenant", five_a_minute()).unwrap();
    // 60 drained tenants (and the resource's own state): none idle for
    // a minute.
    for i in 0..60 {
        assert_eq!(take(&broker, &format!("drained-{i}"), 5), 5);
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(backend.evict_idle(), 0);
    let mut most = 0;
    for i in 0..40 {
        take(&broker, &format!("flood-{i}"), 1);
        most = most.max(backend.len());
    }
    assert!(most <= BOUND + 1, "{most} states held at most");
}

/// The same through the sweep due on time, on a store whose bound is
/// above the size below which no sweep runs.
#[test]
fn a_flood_after_a_sweep_due_on_time_stays_within_the_bound() {
    const LARGE: usize = 8_192;
    let clock = clock();
    let backend = std::sync::Arc::new(MemoryBackend::with_clock(clock.clone()).max_states(LARGE));
    let shared: std::sync::Arc<dyn Store> = backend.clone();
    let broker = ResourceBroker::from_arc(shared);
    broker.register_limit("tenant", five_a_minute()).unwrap();
    for i in 0..8_000 {
        assert_eq!(take(&broker, &format!("drained-{i}"), 5), 5);
    }
    // Past the interval of the sweep due on time, the drained tenants
    // still refilling: the next decision sweeps and drops none.
    clock.advance(Duration::from_secs(11));
    assert_eq!(take(&broker, "drained-0", 1), 0);
    assert_eq!(backend.len(), 8_000);
    let mut most = 0;
    for i in 0..2_000 {
        take(&broker, &format!("flood-{i}"), 1);
        most = most.max(backend.len());
    }
    assert!(most <= LARGE + 1, "{most} states held at most");
}

#[test]
fn a_key_dropped_at_the_bound_comes_back_with_no_more_than_it_had() {
    let clock = clock();
    let (backend, broker) = bounded(&clock);
    broker.register_limit("tenant", five_a_minute()).unwrap();
    assert_eq!(take(&broker, "drained", 9), 5);
    assert_eq!(take(&broker, "used-one", 1), 1);
    // Well over the bound, well under the store's own places (1,024 at
    // least): no time passes, so nothing refills, yet the new keys are not
    // denied.
    assert!(flood(&broker, 120) >= 117);
    assert!(backend.len() <= BOUND + 1);
    assert!(backend.folded() > 50);

    let denied = broker
        .try_acquire_now(("tenant", "drained"), Cost::default())
        .unwrap()
        .unwrap();
    assert!(!denied.allowed, "dropped and made again, still drained");
    assert_eq!(
        denied.wait_time,
        Duration::from_secs(12),
        "one token per 12 s"
    );
    // Never more than it had: 4; less only if flood keys that shared its
    // place took more than one between them.
    let again = take(&broker, "used-one", 9);
    assert!((1..=4).contains(&again), "{again}");
    // Keys never seen mostly start full (most places hold no flood key).
    let full = (0..100)
        .filter(|i| take(&broker, &format!("new-{i}"), 5) == 5)
        .count();
    assert!(full >= 50, "{full} of 100 new keys started full");

    // A place refills as a bucket does: after a minute all is fresh.
    clock.advance(Duration::from_secs(60));
    assert_eq!(take(&broker, "drained", 9), 5);
}

#[test]
fn a_state_holding_a_slot_is_never_dropped() {
    let clock = clock();
    let (backend, broker) = bounded(&clock);
    let limits = five_a_minute().max_concurrent(1);
    broker.register_limit("tenant", limits).unwrap();
    let held = hold(&broker, "holder", 10);
    for i in 0..200 {
        let key = format!("flood-{i}");
        let mut a = broker
            .try_acquire_now(("tenant", key.as_str()), Cost::default())
            .unwrap()
            .unwrap();
        assert!(a.allowed);
        a.permit.release();
    }
    assert!(backend.folded() > 0);
    for i in 0..10 {
        let again = broker
            .try_acquire_now(("tenant", format!("holder-{i}").as_str()), Cost::default())
            .unwrap()
            .unwrap();
        assert!(!again.allowed, "holder-{i}'s slot is still counted");
    }
    drop(held);
    for i in 0..10 {
        let again = broker
            .try_acquire_now(("tenant", format!("holder-{i}").as_str()), Cost::default())
            .unwrap()
            .unwrap();
        assert!(again.allowed, "released, holder-{i}'s slot is free");
    }
}

/// A state of several rate limits is folded bucket by bucket.
#[test]
fn every_bucket_of_a_dropped_state_is_kept() {
    let clock = clock();
    let (backend, broker) = bounded(&clock);
    let limits = Limits::new()
        .rate(RateLimit::per_second(100).with_burst(100))
        .rate(RateLimit::per(3, Duration::from_secs(3600)));
    broker.register_limit("tenant", limits).unwrap();
    assert_eq!(take(&broker, "hourly", 5), 3);
    flood(&broker, 1_000);
    assert!(backend.folded() > 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        take(&broker, "hourly", 5),
        0,
        "the hourly bucket is still empty"
    );
}

/// Bounds below the least are raised to it.
#[test]
fn a_bound_below_the_least_is_raised() {
    assert_eq!(MemoryBackend::new().max_states(0).state_bound(), 64);
    assert_eq!(MemoryBackend::new().state_bound(), 1 << 20);
}

/// One try each of `keys` new keys named `tag-i`.
fn flood_tagged(broker: &ResourceBroker, tag: &str, keys: usize) {
    for i in 0..keys {
        take(broker, &format!("{tag}-{i}"), 1);
    }
}

/// New keys, one a µs (no ties in `last_used`), until the victim's state
/// is folded.
fn fold_victim(backend: &MemoryBackend, broker: &ResourceBroker, clock: &ManualClock, tag: &str) {
    for i in 0..200 {
        if backend.state(&keyed("tenant", "victim")).is_none() {
            return;
        }
        clock.advance(Duration::from_micros(1));
        take(broker, &format!("{tag}-{i}"), 1);
    }
    panic!("victim never folded");
}

/// A config reload adds a limit while long requests made under the old
/// limits still hold slots. A tenant drained under the new limits is
/// folded; once the old requests end, their states (made for the old
/// limits, one bucket) are folded too, into places of their own: the
/// drained tenant's place is untouched.
#[test]
fn a_fold_of_a_state_of_another_bucket_count_keeps_the_places() {
    let handed: Vec<usize> = (0..10).map(|_| slot_scenario()).collect();
    assert_eq!(handed, [0; 10], "tokens a drained tenant came back with");
}

fn slot_scenario() -> usize {
    let clock = clock();
    let (backend, broker) = bounded(&clock);
    let old = Limits::new()
        .rate(RateLimit::per_minute(5))
        .max_concurrent(10);
    broker.register_limit("tenant", old).unwrap();
    let held = hold(&broker, "long", 20);
    clock.advance(Duration::from_millis(1));
    // Reload: one more limit.
    let new = Limits::new()
        .rate(RateLimit::per_minute(5))
        .rate(RateLimit::per(1000, Duration::from_secs(3600)));
    broker.register_limit("tenant", new).unwrap();
    assert_eq!(take(&broker, "victim", 9), 5);
    clock.advance(Duration::from_millis(1));
    fold_victim(&backend, &broker, &clock, "a");
    assert_eq!(
        take(&broker, "victim", 1),
        0,
        "restored drained (so far so good)"
    );
    clock.advance(Duration::from_millis(1));
    fold_victim(&backend, &broker, &clock, "b");
    // The long requests end; their states (old limits) are folded next.
    drop(held);
    clock.advance(Duration::from_millis(1));
    flood_tagged(&broker, "c", 200);
    // 4 ms at 5 a minute: no token has come back.
    take(&broker, "victim", 5)
}

/// The same without slots: states of the old limits still in the table
/// (used within the last minute) are folded in the same sweeps as
/// tenants drained under the new limits, in whichever order the shards
/// come.
#[test]
fn a_reload_that_adds_a_limit_keeps_drained_tenants_drained() {
    let mut refilled = 0;
    for _ in 0..20 {
        let clock = clock();
        let (_backend, broker) = bounded(&clock);
        broker
            .register_limit("tenant", Limits::new().rate(RateLimit::per_minute(5)))
            .unwrap();
        flood_tagged(&broker, "old", 40);
        clock.advance(Duration::from_millis(1));
        let new = Limits::new()
            .rate(RateLimit::per_minute(5))
            .rate(RateLimit::per(1000, Duration::from_secs(3600)));
        broker.register_limit("tenant", new).unwrap();
        for v in 0..10 {
            assert_eq!(take(&broker, &format!("victim-{v}"), 9), 5);
        }
        clock.advance(Duration::from_millis(1));
        flood_tagged(&broker, "new", 200);
        refilled += (0..10)
            .map(|v| take(&broker, &format!("victim-{v}"), 5))
            .sum::<usize>();
    }
    assert_eq!(refilled, 0, "tokens handed to drained tenants");
}

/// The least recently used states are folded first: a state older than
/// every other foldable one goes in the first sweep, also when many
/// newer ones tie at the cutoff (keys used in the same µs, as a flood's
/// are).
#[test]
fn the_least_recently_used_state_is_folded_first() {
    let mut survived = 0;
    for _ in 0..20 {
        let clock = clock();
        let (backend, broker) = bounded(&clock);
        broker
            .register_limit("tenant", Limits::new().rate(RateLimit::per_minute(5)))
            .unwrap();
        take(&broker, "oldest", 1);
        clock.advance(Duration::from_millis(1));
        let mut i = 0;
        while backend.folded() == 0 {
            take(&broker, &format!("new-{i}"), 1);
            i += 1;
        }
        // One sweep: the oldest and 8 of the 64 newer states were due.
        assert!(backend.folded() >= 8, "{}", backend.folded());
        survived += usize::from(backend.state(&keyed("tenant", "oldest")).is_some());
    }
    assert_eq!(
        survived, 0,
        "times the oldest state outlived a sweep that folded newer ones"
    );
}

/// Keys that are each a resource part of their own (keyed calls with state
/// keys without `:`) past the budget of own places are folded into the
/// places shared by every key: a drained one still comes back
/// drained, and waits its own refill.
#[test]
fn a_resource_part_past_the_budget_comes_back_drained() {
    let clock = clock();
    let backend = MemoryBackend::with_clock(clock.clone()).max_states(BOUND);
    let spec = broker_core::LimitSpec::new(&five_a_minute(), Duration::from_secs(60));
    let try_once = |key: &str| {
        backend
            .try_acquire_now(key, &spec, Cost::default())
            .expect("in-memory answers at once")
            .unwrap()
    };
    // The first resource parts to fold take the whole budget.
    for i in 0..2_000 {
        try_once(&format!("warm-{i}"));
    }
    // A new key may start below its burst (its shared place holds flood
    // keys that took a token each); drained either way.
    let first = (0..6).filter(|_| try_once("drained").allowed).count();
    assert!((1..=5).contains(&first), "{first}");
    for i in 0..2_000 {
        try_once(&format!("ip-{i}"));
    }
    assert!(backend.state("drained").is_none(), "folded");
    let again = try_once("drained");
    assert!(!again.allowed, "dropped and made again, still drained");
    assert_eq!(Duration::from_micros(again.wait), Duration::from_secs(12));
}

/// Bound 10,000, 200,000 new keys of one request each: 50 tenants that had
/// used 1 of 10 before get their 9 (no more), a drained one none. Before,
/// the new keys added up in the places and a light tenant was denied 4 of 4.
#[test]
fn tenants_light_before_a_flood_keep_their_allowance() {
    let clock = clock();
    let backend = std::sync::Arc::new(MemoryBackend::with_clock(clock.clone()).max_states(10_000));
    let shared: std::sync::Arc<dyn Store> = backend.clone();
    let broker = ResourceBroker::from_arc(shared);
    broker
        .register_limit("tenant", Limits::new().rate(RateLimit::per_minute(10)))
        .unwrap();
    let light: Vec<String> = (0..50).map(|i| format!("light-{i}")).collect();
    for id in &light {
        assert_eq!(take(&broker, id, 1), 1);
    }
    assert_eq!(take(&broker, "drained", 11), 10);
    clock.advance(Duration::from_millis(100));
    flood(&broker, 200_000);
    assert!(backend.folded() > 190_000, "{}", backend.folded());
    assert!(backend.len() <= 10_001, "{} states", backend.len());
    for id in &light {
        assert!(backend.state(&keyed("tenant", id)).is_none(), "{id} folded");
    }
    let left: Vec<usize> = light.iter().map(|id| take(&broker, id, 10)).collect();
    assert!(left.iter().all(|&n| n == 9), "{left:?}");
    assert_eq!(take(&broker, "drained", 1), 0, "still drained");
}
