//! The state bound with keys of several limits under one resource part
//! (tiers of keyed calls, or states made before a reload): a place is
//! judged and merged under the limits it was made for, and read under
//! other limits in its raw form, which holds no refill under its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod bound_support;

use bound_support::{bounded, clock, hold, spec, take, tries};
use broker_core::{LimitSpec, Limits, LocalStore, ManualClock, RateLimit, Store};
use broker_memory::MemoryBackend;

/// Two tiers of tenants under one resource part ("api"), both one
/// bucket: 5 a minute and 5 a second. A slow tenant drained and folded,
/// then fast tenants folded after it, and a sweep 2 s later: the slow
/// tenant's place is judged by its own limits, kept, and the tenant is
/// still drained (at 5 a minute, 0.17 of a token has come back).
#[test]
fn a_set_is_judged_by_its_own_limits_not_another_tiers() {
    let clock = clock();
    let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let slow = spec(Limits::new().rate(RateLimit::per_minute(5)));
    let fast = spec(Limits::new().rate(RateLimit::per_second(5)));
    assert_eq!(tries(&b, "api:victim", &slow, 9), 5);
    let mut i = 0;
    while b.state("api:victim").is_some() {
        clock.advance(Duration::from_micros(1));
        tries(&b, &format!("api:fast-{i}"), &fast, 1);
        i += 1;
    }
    // One more sweep, folding fast tenants only.
    for j in 0..20 {
        tries(&b, &format!("api:more-{j}"), &fast, 1);
    }
    clock.advance(Duration::from_secs(2));
    b.evict_idle();
    let got = tries(&b, "api:victim", &slow, 5);
    assert_eq!(
        got, 0,
        "drained tenant came back with {got} tokens after 2 s at 5/min"
    );
}

/// Fast tenants folded 2 s after a drained slow tenant, while a penalized
/// fast tenant keeps the fast set alive: they go to the fast set, never
/// merged into the slow tenant's place under the fast limits (which
/// would refill it at their rate). Ten runs (the hash differs per
/// store), the slow tenant is still drained in each.
#[tokio::test]
async fn a_fold_under_other_limits_never_refills_a_drained_place() {
    let mut handed = 0;
    for _ in 0..10 {
        let clock = clock();
        let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
        let slow = spec(Limits::new().rate(RateLimit::per_minute(5)));
        let fast = spec(Limits::new().rate(RateLimit::per_second(5)));
        b.penalize("api:penalized", &fast, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(tries(&b, "api:victim", &slow, 9), 5);
        let mut i = 0;
        while b.state("api:victim").is_some() || b.state("api:penalized").is_some() {
            clock.advance(Duration::from_micros(1));
            tries(&b, &format!("api:fast-{i}"), &fast, 1);
            i += 1;
        }
        clock.advance(Duration::from_secs(2));
        for j in 0..512 {
            tries(&b, &format!("api:late-{j}"), &fast, 1);
        }
        handed += tries(&b, "api:victim", &slow, 5);
    }
    assert_eq!(
        handed, 0,
        "tokens handed to a drained 5/min tenant 2 s later, 10 runs"
    );
}

/// A drained key folded into a shared place (the budget's sets taken),
/// then its limits reloaded to the same rate with a doubled burst (10
/// per 2 minutes). Kept in the table it keeps its 0 tokens (a reload with
/// as many buckets keeps the state); read back from the shared place it
/// has 0 too.
#[test]
fn a_key_in_a_shared_place_comes_back_as_the_table_would_keep_it() {
    let clock = clock();
    let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let old = spec(Limits::new().rate(RateLimit::per_minute(5)));
    let new = spec(Limits::new().rate(RateLimit::per(10, Duration::from_secs(120))));
    for i in 0..2_000 {
        tries(&b, &format!("warm-{i}"), &old, 1);
    }
    // A new key may start below its burst, down to none at all (its
    // shared place holds warm keys that took a token each; which place
    // depends on the store's hash seed); drained either way.
    let first = tries(&b, "drained", &old, 9);
    assert!(first <= 5, "{first}");
    for i in 0..2_000 {
        tries(&b, &format!("ip-{i}"), &old, 1);
    }
    assert!(b.state("drained").is_none(), "folded");
    // Control: a drained key kept in a store, reloaded the same way.
    let c = MemoryBackend::with_clock(clock.clone());
    assert_eq!(tries(&c, "kept", &old, 9), 5);
    assert_eq!(tries(&c, "kept", &new, 10), 0, "kept in the table: 0");
    let got = tries(&b, "drained", &new, 10);
    assert_eq!(got, 0, "folded key came back with {got} tokens");
}

/// The broker's own path: a reload tightens a tenant limit (5 a second
/// to 5 a minute) while requests made under the old limits hold slots.
/// A tenant drained under the new limits is folded; the old requests
/// end and their states (old limits, one bucket) are folded last, into a
/// set of their own. 2 s later `evict_idle` drops only what has refilled,
/// and the drained tenant is still drained.
#[test]
fn a_reload_that_tightens_a_limit_keeps_drained_tenants_drained() {
    use broker_core::keys::keyed;
    let clock = clock();
    let (backend, broker) = bounded(&clock);
    let take = |key: &str, n: usize| take(&broker, key, n);
    let old = Limits::new()
        .rate(RateLimit::per_second(5))
        .max_concurrent(10);
    broker.register_limit("tenant", old).unwrap();
    let held = hold(&broker, "long", 20);
    clock.advance(Duration::from_millis(1));
    let new = Limits::new()
        .rate(RateLimit::per_minute(5))
        .max_concurrent(10);
    broker.register_limit("tenant", new).unwrap();
    assert_eq!(take("victim", 9), 5);
    clock.advance(Duration::from_millis(1));
    let mut i = 0;
    while backend.state(&keyed("tenant", "victim")).is_some() {
        clock.advance(Duration::from_micros(1));
        take(&format!("a-{i}"), 1);
        i += 1;
    }
    drop(held);
    clock.advance(Duration::from_millis(1));
    // One sweep: the 8 least recently used, old requests' states.
    let before = backend.folded();
    let mut j = 0;
    while backend.folded() == before {
        take(&format!("c-{j}"), 1);
        j += 1;
    }
    clock.advance(Duration::from_secs(2));
    backend.evict_idle();
    let got = take("victim", 5);
    assert_eq!(got, 0, "drained at 5/min, back with {got} tokens 2 s later");
}

/// Threads folding, restoring, dropping sets (sweeps and evict_idle) with
/// time passing, one spec: no hot key is allowed more than its burst plus
/// its refill.
#[test]
fn threads_with_time_passing_never_pass_a_keys_limit() {
    use std::sync::atomic::AtomicUsize;
    let clock = ManualClock::new();
    let start = 1_000_000_000u64;
    clock.set(start);
    let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let s = spec(Limits::new().rate(RateLimit::per_second(5)));
    const HOT: usize = 8;
    let allowed: Vec<AtomicUsize> = (0..HOT).map(|_| AtomicUsize::new(0)).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                b.evict_idle();
                std::thread::yield_now();
            }
        });
        let hs: Vec<_> = (0..2u64)
            .map(|t| {
                let (b, s, clock, allowed) = (&b, &s, &clock, &allowed);
                sc.spawn(move || {
                    for i in 0..60_000u64 {
                        tries(b, &format!("t:f{t}-{i}"), s, 1);
                        let h = (i as usize * 3 + t as usize) % HOT;
                        if tries(b, &format!("t:hot-{h}"), s, 1) == 1 {
                            allowed[h].fetch_add(1, Ordering::Relaxed);
                        }
                        if t == 0 && i % 50 == 0 {
                            clock.advance(Duration::from_micros(20_000));
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = (broker_core::Clock::now(&clock) - start) as f64 / 1e6;
    let most = (5.0 + elapsed * 5.0).floor() as usize;
    for (h, n) in allowed.iter().enumerate() {
        let n = n.load(Ordering::Relaxed);
        assert!(n <= most, "hot-{h} allowed {n}, at most {most}");
    }
    eprintln!("folded {} elapsed {elapsed}", b.folded());
}

/// A place merged under limits F (5 a second) and read after a reload to
/// S (5 a minute): the table refills a kept state lazily, under the
/// limits of its next call, so it holds ~0 tokens; the place is read in
/// its raw form (no refill under F), and holds ~0 too. Within 0.9 s of
/// the drain the victim is not idle under F, so the table would have kept
/// it.
#[test]
fn a_place_merged_under_fast_limits_is_read_raw_under_slower_ones() {
    let mut handed = 0;
    for _ in 0..10 {
        let clock = clock();
        let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
        let c = MemoryBackend::with_clock(clock.clone()); // control: keeps every state
        let fast = spec(Limits::new().rate(RateLimit::per_second(5)));
        let slow = spec(Limits::new().rate(RateLimit::per_minute(5)));
        assert_eq!(tries(&b, "api:victim", &fast, 9), 5);
        assert_eq!(tries(&c, "api:victim", &fast, 9), 5);
        // Other tenants, one call each, 500 us apart, over 0.9 s.
        for i in 0..1_800 {
            clock.advance(Duration::from_micros(500));
            tries(&b, &format!("api:f-{i}"), &fast, 1);
        }
        assert!(b.state("api:victim").is_none(), "folded");
        // Reload: the resource part's limits are now 5 a minute.
        let kept = tries(&c, "api:victim", &slow, 5);
        assert_eq!(kept, 0, "the table keeps it drained");
        handed += tries(&b, "api:victim", &slow, 5);
    }
    assert_eq!(
        handed, 0,
        "a drained tenant, read under 5/min 0.9 s later: {handed} tokens over 10 runs"
    );
}

/// A set is kept while anything was folded into it within the table's
/// RECENT (50 ms), idle or not: the table keeps a state that long, and a
/// reload to slower limits reads it.
#[test]
fn a_set_folded_into_within_recent_is_kept_for_a_reload() {
    let clock = clock();
    let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let quick = spec(Limits::new().rate(RateLimit::per(5, Duration::from_millis(5))));
    let slow = spec(Limits::new().rate(RateLimit::per_minute(5)));
    assert_eq!(tries(&b, "api:victim", &quick, 9), 5);
    clock.advance(Duration::from_micros(1));
    for i in 0..63 {
        tries(&b, &format!("api:k-{i}"), &quick, 1);
    }
    clock.advance(Duration::from_millis(10));
    let before = b.folded();
    let mut i = 0;
    while b.folded() == before {
        tries(&b, &format!("api:n-{i}"), &quick, 1);
        i += 1;
    }
    assert!(b.state("api:victim").is_none(), "folded");
    // Control: the same store's table would keep the victim (used 10 ms
    // ago, < RECENT), and reading it under 5/min gives ~0 tokens.
    let got = tries(&b, "api:victim", &slow, 5);
    assert_eq!(
        got, 0,
        "folded victim came back with {got} tokens 10 ms after draining"
    );
}

/// With the places' budget spent, the states of resource parts of twelve
/// limits share the shared places (raw form, judged under the slowest
/// refill and largest burst folded in): the store stays at its bound.
#[test]
fn resource_parts_of_many_limits_stay_within_the_bound() {
    let clock = clock();
    let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let specs: Vec<LimitSpec> = (0..12)
        .map(|j| spec(Limits::new().rate(RateLimit::per_minute(5 + j))))
        .collect();
    let mut most = 0;
    for i in 0..30_000usize {
        clock.advance(Duration::from_micros(1));
        let j = i % 12;
        tries(&b, &format!("r{j}:{i}"), &specs[j], 1);
        most = most.max(b.len());
    }
    assert!(most <= 65, "bound 64, held {most}");
}

/// A penalty on a key of a concurrency limit alone has no bucket to fold
/// into a place: the store keeps the state, through sweeps of idle states
/// and folds at the bound, until the penalty ends.
#[tokio::test]
async fn a_penalty_without_rate_limits_is_kept_through_sweeps_and_folds() {
    let clock = clock();
    let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let slots = spec(Limits::new().max_concurrent(1));
    let fast = spec(Limits::new().rate(RateLimit::per_second(5)));
    b.penalize("api:held", &slots, Duration::from_secs(3600))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(1));
    b.evict_idle();
    for i in 0..512 {
        clock.advance(Duration::from_micros(1));
        tries(&b, &format!("api:fast-{i}"), &fast, 1);
    }
    assert!(b.folded() > 0, "the bound folded states");
    let penalty_end = b.state("api:held").expect("kept").penalty;
    assert_eq!(penalty_end, 1_000_000_000 + 3_600_000_000);
    let d = b
        .try_acquire("api:held", &slots, broker_core::Cost::default())
        .await
        .unwrap();
    assert!(!d.allowed && d.wait > 3_598_000_000, "{d:?}");
    clock.set(penalty_end);
    b.evict_idle();
    assert!(b.state("api:held").is_none(), "dropped once it ended");
}

/// Keys of one bucket penalized for an hour and folded while the penalty
/// lasts, then read under limits with another number of rate limits (a
/// reload that adds one, or drops them for a concurrency limit alone):
/// their places cannot give their buckets to the new ones, but keep the
/// penalty, as a state kept in the table keeps it (`state::adopt`).
#[tokio::test]
async fn a_penalty_folded_away_outlives_a_reload_to_another_number_of_limits() {
    let clock = clock();
    let b = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let one = spec(Limits::new().rate(RateLimit::per_minute(5)));
    let two = spec(
        Limits::new()
            .rate(RateLimit::per_minute(5))
            .rate(RateLimit::per(100, Duration::from_secs(3600))),
    );
    let slots = spec(Limits::new().max_concurrent(2));
    let hour = Duration::from_secs(3600);
    for key in ["api:to-two", "api:to-slots"] {
        b.penalize(key, &one, hour).await.unwrap();
    }
    let mut i = 0;
    while b.state("api:to-two").is_some() || b.state("api:to-slots").is_some() {
        clock.advance(Duration::from_micros(1));
        tries(&b, &format!("api:other-{i}"), &one, 1);
        i += 1;
    }
    clock.advance(Duration::from_secs(60));
    for (key, spec) in [("api:to-two", &two), ("api:to-slots", &slots)] {
        let d = b
            .try_acquire_now(key, spec, broker_core::Cost::default())
            .expect("in-memory answers at once")
            .unwrap();
        assert_eq!(
            (d.allowed, d.denied_by),
            (false, Some(broker_core::DenyReason::Rate)),
            "{key}"
        );
        let left = Duration::from_micros(d.wait);
        assert!(
            left > hour - Duration::from_secs(61) && left <= hour - Duration::from_secs(60),
            "{key}: {left:?} left"
        );
    }
    // A key that shares none of the penalized keys' places is not penalized.
    assert_eq!(tries(&b, "other-part:fresh", &two, 1), 1);
}
