//! The memory a bounded store holds under a flood of keys that are each a
//! resource part of their own (keyed calls with state keys without `:`,
//! e.g. `ip-10.0.0.7`): the states stay within the bound, and the places
//! their folds go to stay within their budget (own places, then the places
//! shared by every key).
#![forbid(unsafe_code)]

use std::alloc::System;

use broker_core::{Cost, LimitSpec, Limits, LocalStore, ManualClock, RateLimit};
use broker_memory::MemoryBackend;
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

/// The system allocator, counting the bytes live (`stats_alloc`).
#[global_allocator]
static A: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The bytes live on the heap now.
fn live() -> isize {
    let s = A.stats();
    s.bytes_allocated as isize - s.bytes_deallocated as isize + s.bytes_reallocated
}

#[test]
fn a_flood_of_resource_parts_stays_within_the_bound_and_the_budget() {
    let clock = ManualClock::new();
    clock.set(1_000_000_000);
    let backend = MemoryBackend::with_clock(clock.clone()).max_states(64);
    let spec = LimitSpec::new(
        &Limits::new().rate(RateLimit::per_minute(5)),
        std::time::Duration::from_secs(60),
    );
    // The table at the bound, and the budget of places taken.
    for i in 0..1_000 {
        backend.try_acquire_now(&format!("warm-{i}"), &spec, Cost::default());
    }
    let base = live();
    let (mut most, mut allowed) = (0, 0);
    let mut flood = |from: usize| {
        for i in from..from + 4_000 {
            let decided = backend.try_acquire_now(&format!("ip-{i}"), &spec, Cost::default());
            allowed += usize::from(decided.unwrap().unwrap().allowed);
            most = most.max(backend.len());
        }
    };
    // Past the own places' budget, each flood fills more of the 4,096
    // shared places, and less each time.
    let mut grown = Vec::new();
    for round in 0..3 {
        let before = live();
        flood(round * 4_000);
        grown.push(live() - before);
    }
    // Each new key took one token of five: its shared place seldom holds
    // enough others to deny it.
    assert!(allowed >= 11_000, "{allowed} of 12,000 new keys allowed");
    assert!(most <= 65, "{most} states held");
    assert!(backend.folded() > 12_000);
    let total = live() - base;
    assert!(total < 1 << 20, "{total} bytes more for 12,000 keys");
    assert!(grown[2] < grown[1] && grown[1] < grown[0], "{grown:?}");
}
