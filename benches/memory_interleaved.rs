//! The cases of `memory_try_acquire`, measured for a machine that other
//! work disturbs: every subject runs a short batch in turn, round after
//! round, and each keeps its fastest batch. A slow spell then costs a
//! subject one batch, not its result, and every subject has the same
//! chances at a quiet moment. Governor's keyed `check_key` runs in the same
//! rounds; the table gives each subject's best ns per call and its ratio
//! to governor's.
//!
//! Subjects (keyed on `("tenants", key)`, the analogue of governor's keys):
//! - `by_id`: `broker.try_acquire(..)`, one future per call answered by
//!   `futures`' `FutureExt::now_or_never` (one poll, which makes the call
//!   synchronously);
//! - `by_id_awaited`: the same calls awaited inside one async block polled
//!   once, as a handler awaits them;
//! - `by_id_now`: the synchronous `broker.try_acquire_now(..)`;
//! - `handle`, `handle_awaited`, `handle_now`: the same three through
//!   `broker.resource_handle("tenants")`;
//! - `store`: the store's decision alone (`LocalStore::states`);
//! - `store_keyed`: the store's keyed call, `LocalStore::try_acquire_now` on
//!   the joined state key (`tenants:<key>`), as a direct user of the
//!   backend makes it.
//!
//! Every batch starts with one untimed call per key, so each subject is
//! timed with its own states (and governor with its map) in the cache,
//! whichever subject ran before it: without it, a subject that followed
//! another table's subject paid for its first pass over 10,000 keys (by id
//! `now_or_never`, right after governor, took 1.12–1.22× governor's time
//! where the synchronous call on the same states took 0.83–0.91×).
//!
//! Each call's answer is kept from the optimizer by whether it allowed, as
//! governor's `check_key` answers (its denial, `NotUntil`, computes no
//! wait until asked). The `wait read` case keeps each denial's wait
//! instead: governor's asked with `wait_time_from` and the limiter's
//! clock, ours read from the answer, as a caller answering `Retry-After`
//! reads it.
//!
//! The `two threads` cases run each subject's batch on two threads started
//! together, each from its own key offset. Their figure is the batch's wall
//! time per call of one thread, as criterion's `threads2` gives it, and the
//! median batch rather than the fastest: a batch whose threads happened to
//! run one after the other, without contention, is the fastest.
//!
//! Run: `cargo bench -p resource-broker-benches --bench memory_interleaved`
//! (env: `ROUNDS=40`, `BATCH=100000`; for a profiler, `ONLY=<subject>`
//! runs one subject and `CASE=<prefix>` the cases whose name starts with
//! it).

#![forbid(unsafe_code)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::{Cost, LimitSpec, Limits, LocalStates, LocalStore, RateLimit, ResourceBroker};
use broker_memory::MemoryBackend;
use futures::FutureExt;
use governor::clock::Clock as _;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

const SUBJECTS: [&str; 9] = [
    "governor_keyed",
    "by_id",
    "by_id_awaited",
    "by_id_now",
    "handle",
    "handle_awaited",
    "handle_now",
    "store",
    "store_keyed",
];

struct Case {
    broker: ResourceBroker,
    handle: broker_core::ResourceHandle,
    store: Arc<dyn LocalStates>,
    backend: MemoryBackend,
    spec: LimitSpec,
    /// `keys`, each joined to the resource as a state key.
    joined: Vec<String>,
    governor: DefaultKeyedRateLimiter<String>,
    keys: Vec<String>,
}

fn case(per_second: u32, burst: u32, keys: usize) -> Case {
    let broker = ResourceBroker::new(MemoryBackend::new());
    let limits =
        Limits::new().rate(RateLimit::per_second(per_second as u64).with_burst(burst as u64));
    broker.register_limit("tenants", limits.clone()).unwrap();
    let quota = Quota::per_second(NonZeroU32::new(per_second).unwrap())
        .allow_burst(NonZeroU32::new(burst).unwrap());
    let spec = Arc::new(LimitSpec::new(&limits, Duration::from_secs(60)));
    Case {
        handle: broker.resource_handle("tenants").unwrap(),
        broker,
        store: MemoryBackend::new()
            .states("tenants", spec.clone())
            .expect("the in-memory store holds its states in process"),
        backend: MemoryBackend::new(),
        spec: LimitSpec::clone(&spec),
        joined: (0..keys)
            .map(|i| broker_core::keys::keyed("tenants", &format!("tenant-{i}")))
            .collect(),
        governor: RateLimiter::dashmap(quota),
        keys: (0..keys).map(|i| format!("tenant-{i}")).collect(),
    }
}

/// One batch of `n` calls of subject `s` on each of `threads` threads at
/// once, each cycling through the keys from its own offset (so that two
/// threads on 10,000 keys mostly touch different keys); the wall time.
fn batch(c: &Case, s: usize, n: usize, threads: usize, wait: bool) -> Duration {
    if wait {
        // One thread only (the case that reads the wait).
        for t in 0..threads {
            wait_batch_from(c, s, c.keys.len(), t * c.keys.len() / threads);
        }
        return wait_batch_from(c, s, n, 0);
    }
    // Untimed, one call per key first: every subject's batch starts with
    // its states (and governor's) in the cache, whichever subject ran
    // before it on which table.
    for t in 0..threads {
        batch_from(c, s, c.keys.len(), t * c.keys.len() / threads);
    }
    if threads == 1 {
        return batch_from(c, s, n, 0);
    }
    let start = Instant::now();
    let start_together = std::sync::Barrier::new(threads);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let offset = t * c.keys.len() / threads;
            let start_together = &start_together;
            scope.spawn(move || {
                start_together.wait();
                batch_from(c, s, n, offset)
            });
        }
    });
    start.elapsed()
}

/// Defines `$name(c, s, n, offset)`: `n` calls of subject `s` on this
/// thread, from key `offset` on; the wall time. Each answer is kept from
/// the optimizer by `$keep` (`allowed`, or `wait`: the denial's wait).
/// Each kind is a function of its own, out of line, so that one does not
/// change how the other is compiled.
macro_rules! batch_from {
    ($(#[$doc:meta])* $name:ident, $keep:ident) => {
        $(#[$doc])*
        #[inline(never)]
        fn $name(c: &Case, s: usize, n: usize, offset: usize) -> Duration {
            let keys = &c.keys;
            // Governor's keys are `String`s; ours are taken as `&str`.
            let owned_key = |i: usize| &keys[(offset + i) % keys.len()];
            let key = |i: usize| owned_key(i).as_str();
            let start = Instant::now();
            match s {
                0 => (0..n).for_each(|i| {
                    keep!($keep, governor c, c.governor.check_key(owned_key(i)));
                }),
                1 => (0..n).for_each(|i| {
                    let a = c.broker.try_acquire(("tenants", key(i)), Cost::default());
                    keep!($keep, a.now_or_never().unwrap().unwrap());
                }),
                2 => async {
                    for i in 0..n {
                        let a = c.broker.try_acquire(("tenants", key(i)), Cost::default());
                        keep!($keep, a.await.unwrap());
                    }
                }
                .now_or_never()
                .unwrap(),
                3 => (0..n).for_each(|i| {
                    let a = c
                        .broker
                        .try_acquire_now(("tenants", key(i)), Cost::default());
                    keep!($keep, a.unwrap().unwrap());
                }),
                4 => (0..n).for_each(|i| {
                    let a = c.handle.try_acquire(key(i), Cost::default());
                    keep!($keep, a.now_or_never().unwrap().unwrap());
                }),
                5 => async {
                    for i in 0..n {
                        let a = c.handle.try_acquire(key(i), Cost::default());
                        keep!($keep, a.await.unwrap());
                    }
                }
                .now_or_never()
                .unwrap(),
                6 => (0..n).for_each(|i| {
                    let a = c.handle.try_acquire_now(key(i), Cost::default());
                    keep!($keep, a.unwrap().unwrap());
                }),
                7 => (0..n).for_each(|i| {
                    keep!($keep, decision c.store.try_acquire(Some(key(i)), Cost::default()));
                }),
                _ => (0..n).for_each(|i| {
                    let joined = &c.joined[(offset + i) % keys.len()];
                    let d = c.backend.try_acquire_now(joined, &c.spec, Cost::default());
                    keep!($keep, decision d.unwrap().unwrap());
                }),
            }
            start.elapsed()
        }
    };
}

/// Keeps one answer from the optimizer: whether it allowed, or its wait
/// (governor's asked from its denial with the limiter's clock, as a
/// caller answering `Retry-After` asks it).
macro_rules! keep {
    (allowed, governor $c:ident, $answer:expr) => {
        black_box($answer.is_ok())
    };
    (wait, governor $c:ident, $answer:expr) => {
        black_box($answer.map_or_else(
            |not_until| not_until.wait_time_from($c.governor.clock().now()),
            |()| Duration::ZERO,
        ))
    };
    (allowed, decision $d:expr) => {
        black_box($d.allowed)
    };
    (wait, decision $d:expr) => {
        black_box($d.wait)
    };
    (allowed, $a:expr) => {
        black_box($a.allowed)
    };
    (wait, $a:expr) => {
        black_box($a.wait_time)
    };
}

batch_from!(batch_from, allowed);
batch_from!(wait_batch_from, wait);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo test --benches` runs bench targets with `--bench` absent: then
    // one short round checks that every subject runs.
    let benching = std::env::args().any(|a| a == "--bench");
    let rounds = if benching { env("ROUNDS", 40) } else { 1 };
    let n = if benching {
        env("BATCH", 100_000)
    } else {
        1_000
    };
    println!(
        "rounds={rounds} batch={n}: best ns per call (two threads: median), and / governor_keyed"
    );
    println!();
    print!("| case |");
    SUBJECTS.iter().for_each(|s| print!(" {s} |"));
    println!();
    print!("|---|");
    SUBJECTS.iter().for_each(|_| print!("---|"));
    println!();
    for (name, deny, keys, threads, wait) in [
        ("allow, one key", false, 1, 1, false),
        ("allow, 10,000 keys", false, 10_000, 1, false),
        ("deny, one key", true, 1, 1, false),
        ("deny, 10,000 keys", true, 10_000, 1, false),
        ("allow, one key, two threads", false, 1, 2, false),
        ("allow, 10,000 keys, two threads", false, 10_000, 2, false),
        ("wait read, deny, 10,000 keys", true, 10_000, 1, true),
    ] {
        if std::env::var("CASE").is_ok_and(|p| !name.starts_with(&p)) {
            continue;
        }
        let c = if deny {
            case(1, 1, keys)
        } else {
            // A rate low enough that no state is full again (none is idle
            // and evicted) and a burst no run exhausts.
            case(1000, 1_000_000_000, keys)
        };
        if deny {
            // Exhaust every state first, so the measured calls are denials.
            (0..SUBJECTS.len()).for_each(|s| {
                batch(&c, s, keys, 1, false);
            });
            assert!(
                !c.handle
                    .try_acquire_now(&*c.keys[0], Cost::default())
                    .unwrap()
                    .unwrap()
                    .allowed
            );
            assert!(c.governor.check_key(&c.keys[0]).is_err());
        }
        let mut all: [Vec<f64>; SUBJECTS.len()] = Default::default();
        for _ in 0..rounds {
            for (s, ns_all) in all.iter_mut().enumerate() {
                if std::env::var("ONLY").is_ok_and(|o| o != SUBJECTS[s]) {
                    continue;
                }
                ns_all.push(batch(&c, s, n, threads, wait).as_nanos() as f64 / n as f64);
            }
        }
        // One thread: the fastest batch. Two threads: the median batch, as
        // a batch whose threads happened to run one after the other (no
        // contention) is faster than one whose threads ran at once.
        let best = all.map(|mut v| {
            v.sort_by(f64::total_cmp);
            match (v.is_empty(), threads) {
                (true, _) => f64::MAX,
                (false, 1) => v[0],
                (false, _) => v[v.len() / 2],
            }
        });
        print!("| {name} |");
        for b in best {
            match (b < f64::MAX, best[0] < f64::MAX) {
                (true, true) => print!(" {b:.1} ({:.2}) |", b / best[0]),
                (true, false) => print!(" {b:.1} |"),
                (false, _) => print!(" - |"),
            }
        }
        println!();
    }
}
