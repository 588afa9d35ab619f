//! Tests of [`super`].

use super::*;

/// A folded key keeps a place of its own while the budget has room; past
/// it, keys share a place: each new key of that place starts from the
/// fewest tokens any of them had, a key of another place starts fresh,
/// and places are emptied once refilled and `RECENT` passed.
#[test]
fn keys_past_the_budget_share_a_place() {
    use broker_core::{Limits, RateLimit};
    let spec = Arc::new(LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(10)),
        std::time::Duration::from_secs(60),
    ));
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
    let spills = Spills::default();
    let fold = |hash, tokens, spec| spills.fold(hash, &with(tokens), spec, now, 64);
    let left = |hash: u64, at: Micros| {
        spills
            .restore(hash, &spec, at)
            .map_or(10.0, |s| s.buckets[0].tokens)
    };
    // A budget of 1,024 own places, then 4,096 shared ones.
    let own = |k: u64| 1 << 40 | k;
    for k in 0..1024 {
        fold(own(k), 9.0, &spec);
    }
    // The hashes `3 + 4096 * k` share place 3.
    let key = |k: u64| 3 + 4096 * k;
    fold(key(0), 7.0, &spec);
    fold(key(1), 5.0, &spec);
    fold(own(0), 8.0, &spec);
    assert_eq!(spills.folded.load(Ordering::Relaxed), 1027);
    assert_eq!(left(own(0), now), 8.0, "its own place");
    assert_eq!(left(own(1), now), 9.0);
    assert_eq!(left(key(0), now), 5.0, "no more than it had");
    assert_eq!(left(key(2), now), 5.0, "a new key of the place");
    assert_eq!(left(4, now), 10.0, "another place: fresh");
    // Refilled after a minute; emptied once dropped.
    let later = now + 60_000_000;
    assert_eq!(left(key(0), later), 10.0);
    spills.drop_idle(later);
    assert_eq!(spills.places.lock().own.len(), 0);
    assert!(!spills.any.load(Ordering::Relaxed));
}

/// New keys made while another thread folds, past the states it
/// counted, are not let past the bound: an insert an eighth past it
/// waits for the fold to end and then folds in turn. Here the fold
/// is held (at a lock the test takes) after it has counted the states,
/// while another thread makes 200 new keys; before, the fold ended with
/// all 200 kept and the next one due only an eighth past them.
#[test]
fn keys_made_during_a_fold_do_not_pass_the_bound() {
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
    let keys = |part: &'static str, n: usize| (0..n).map(move |i| format!("{part}:k{i}"));
    let take = |key: &str| {
        backend
            .try_acquire_now(key, &spec, Cost::default())
            .unwrap()
            .unwrap()
    };
    // 65 keys of `r`: the 65th folds 9 of them; 8 more bring the store
    // to its bound.
    for key in keys("r", 73) {
        assert!(take(&key).allowed);
    }
    assert_eq!(backend.len(), 64);
    let sweeper = &store.sweeper;
    sweeper.counted.store(false, Ordering::Relaxed);
    let paused = sweeper.after_count.lock();
    // One more key: its insert folds, and waits once it has counted.
    std::thread::scope(|s| {
        let folding = s.spawn(|| take("s"));
        while !sweeper.counted.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        // Meanwhile, 200 new keys.
        let inserting = s.spawn(|| {
            keys("other", 200).for_each(|k| {
                take(&k);
            })
        });
        while !inserting.is_finished() && sweeper.waiting.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        drop(paused);
        folding.join().unwrap();
        inserting.join().unwrap();
    });
    assert!(backend.len() <= 65, "{} states, bound 64", backend.len());
}
