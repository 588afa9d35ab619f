//! Tests of [`super`].

use super::places::WAYS;
use super::*;

/// A set made and then swept before anything is folded into it (a
/// sweep racing a fold) is judged by the limits it was made for.
#[test]
fn a_set_with_nothing_folded_is_dropped_without_a_panic() {
    let spills = Spills::new();
    let params = [BucketParams::new(5.0, 5.0, 60_000_000.0)];
    assert!(spills.set_for(&"ip-1".into(), &params, 1024).is_some());
    spills.drop_idle(1_000_000);
    assert!(spills.by_resource.read().is_empty());
    assert!(!spills.any.load(Ordering::Relaxed));
}

/// A group keeps its first keys apart, each in a place of its own; the
/// keys folded once those are taken share the group's state, which new
/// keys start from, and none comes back with more than it had.
#[test]
fn a_group_keeps_its_first_keys_apart_and_the_rest_together() {
    use broker_core::{Limits, RateLimit};
    let spec = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(10)),
        std::time::Duration::from_secs(60),
    );
    let now: Micros = 1_000_000;
    let with = |tokens: f64| ResourceState {
        buckets: vec![BucketState {
            tokens,
            ts: now,
            nb: 0,
        }],
        leases: Vec::new(),
        penalty: 0,
    };
    let spills = Spills::new();
    let part: Arc<str> = "tenant".into();
    // 64 places, 8 groups: the keys `3 + 16 * k` share group 3.
    let left = |hash: u64| {
        spills
            .restore("tenant", hash, &spec, now)
            .map_or(10.0, |s| s.buckets[0].tokens)
    };
    let key = |k: u64| 3 + 16 * k;
    for k in 0..WAYS as u64 {
        spills.fold(&part, key(k), &with(k as f64), &spec, now, 128);
    }
    assert_eq!(
        spills.by_resource.read()["tenant"][0].table.lock().places(),
        64
    );
    // Past the group's places: together.
    spills.fold(&part, key(10), &with(7.0), &spec, now, 128);
    spills.fold(&part, key(11), &with(5.0), &spec, now, 128);
    for k in 0..WAYS as u64 {
        assert_eq!(left(key(k)), k as f64, "key {k}: its own place");
    }
    assert_eq!(left(key(10)), 5.0, "no more than it had");
    assert_eq!(left(key(11)), 5.0);
    assert_eq!(left(key(12)), 5.0, "a new key of the group");
    assert_eq!(left(4), 10.0, "another group: fresh");
    // A place whose state has refilled is free again after `RECENT`.
    let later = now + 60_000_000;
    spills.fold(&part, key(12), &with(2.0), &spec, later, 128);
    let table = spills.by_resource.read()["tenant"][0].clone();
    assert!(matches!(table.table.lock().find(key(12)), At::Own(_)));
}

/// New keys made while another thread folds, past the states it
/// counted, are not let past the bound: an insert an eighth past it
/// waits for the fold to end and then folds in turn. Here the fold
/// is held at a place set's lock (taken by the test) after it has
/// counted the states, while another thread makes 200 new keys;
/// before, the fold ended with all 200 kept and the next one due only
/// an eighth past them.
#[test]
fn keys_made_during_a_fold_do_not_pass_the_bound() {
    use crate::key::with_parsed;
    use broker_core::{Cost, Limits, LocalStore, ManualClock, RateLimit};
    use std::time::Duration;

    let clock = ManualClock::new();
    clock.set(1_000_000);
    let backend = crate::MemoryBackend::with_clock(clock.clone()).max_states(64);
    let store = backend.store.clone();
    let spec = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(5)),
        Duration::from_secs(60),
    );
    let shard = |key: &str| with_parsed(key, |k| store.states.shard_index(k));
    // Keys of `part` in shard 0 (`in_zero`) or in any other.
    let keys = |part: &'static str, in_zero: bool, n: usize| {
        (0..)
            .map(move |i| format!("{part}:k{i}"))
            .filter(move |k| (shard(k) == 0) == in_zero)
            .take(n)
            .collect::<Vec<_>>()
    };
    let take = |key: &str| {
        backend
            .try_acquire_now(key, &spec, Cost::default())
            .unwrap()
            .unwrap()
    };
    // 65 keys of `r` in shard 0: the 65th folds 9 of them, which
    // makes `r`'s place set; 8 more bring the store to its bound.
    for key in keys("r", true, 73) {
        assert!(take(&key).allowed);
    }
    assert_eq!(backend.len(), 64);
    let set = store.spills.by_resource.read()["r"][0].clone();
    let held = set.table.lock();
    // One more key (another part, no place set to read): its insert
    // folds, and waits at the set's lock once it has counted the states.
    let s_key = keys("s", true, 1).pop().unwrap();
    let flood = keys("other", false, 200);
    std::thread::scope(|s| {
        let folding = s.spawn(|| take(&s_key));
        while Arc::strong_count(&set) < 3 {
            std::thread::yield_now();
        }
        // Meanwhile, 200 new keys in other shards.
        let inserting = s.spawn(|| {
            flood.iter().for_each(|k| {
                take(k);
            })
        });
        while !inserting.is_finished() && store.sweeper.waiting.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        drop(held);
        folding.join().unwrap();
        inserting.join().unwrap();
    });
    assert!(backend.len() <= 65, "{} states, bound 64", backend.len());
}
