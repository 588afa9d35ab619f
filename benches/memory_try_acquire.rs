//! `ResourceBroker::try_acquire` on the in-memory backend, side by side with
//! governor's direct and keyed (dashmap) limiters in the same run.
//!
//! Groups (each compares ours with governor under the same quota):
//! - `allow/one_key`: one state, 1000/s with a burst of 10^9, so every call
//!   is allowed;
//! - `allow/keys_10k`: 10,000 keyed states `("tenants", key)`, cycled;
//! - `deny/one_key`, `deny/keys_10k`: every state exhausted first, a quota
//!   of 1/s, so (almost) every call is denied;
//! - `threads2/one_key`, `threads2/keys_10k`: two threads at once (one
//!   iteration = one decision on each thread); on one key, the resource's
//!   own state (`broker_try_acquire`, against governor's direct limiter)
//!   and one keyed state.
//!
//! `handle_try_acquire_keyed` is the same keyed call through
//! `ResourceBroker::resource_handle("tenants")`, which skips the lookup of
//! the resource by id; `handle_try_acquire_now_keyed` is the handle's
//! synchronous `try_acquire_now` (no future).
//!
//! `broker_try_acquire_now_keyed` is the keyed call by resource id through
//! the synchronous `try_acquire_now`. The `*_awaited` cases run their
//! calls inside one async block, each `.await`ed as an application's
//! handler awaits it, and poll that block once: the cost of a call as
//! used. The other async cases answer one future per call with
//! `futures::FutureExt::now_or_never` (one poll, which makes the call
//! synchronously, as `try_acquire_now` does).
//!
//! `memory_local_states_try_acquire` is the store's decision alone, through
//! the per-resource states the broker calls (`LocalStore::states`): the
//! difference to `broker_try_acquire_keyed` is the facade (registry lookup,
//! the cost-fit check, counters, the `Acquisition` and its permit, the
//! future).
//!
//! Run: `cargo bench -p resource-broker-benches --bench memory_try_acquire --
//! --warm-up-time 1 --measurement-time 3`

#![forbid(unsafe_code)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use std::sync::Arc;

use broker_core::{
    Cost, LimitSpec, Limits, LocalStates, LocalStore, RateLimit, ResourceBroker, ResourceHandle,
};
use broker_memory::MemoryBackend;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures::FutureExt;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

const KEYS: usize = 10_000;
/// A burst so large that neither limiter denies during a run, at a rate
/// low enough that no state is ever full again (so none is idle and
/// evicted: the keyed runs measure decisions, not re-creations).
const BIG_BURST: u32 = 1_000_000_000;

struct Subjects {
    broker: ResourceBroker,
    /// `broker.resource_handle("tenants")`: keyed calls without the lookup
    /// by resource id.
    tenants: ResourceHandle,
    /// A second store's states of `tenants`, called directly: the decision
    /// without the facade.
    store: Arc<dyn LocalStates>,
    direct: DefaultDirectRateLimiter,
    keyed: DefaultKeyedRateLimiter<String>,
    keys: Vec<String>,
}

fn subjects(per_second: u32, burst: u32) -> Subjects {
    let broker = ResourceBroker::new(MemoryBackend::new());
    let limits =
        Limits::new().rate(RateLimit::per_second(per_second as u64).with_burst(burst as u64));
    broker.register_limit("one", limits.clone()).unwrap();
    broker.register_limit("tenants", limits.clone()).unwrap();
    let quota = Quota::per_second(NonZeroU32::new(per_second).unwrap())
        .allow_burst(NonZeroU32::new(burst).unwrap());
    let keys: Vec<String> = (0..KEYS).map(|i| format!("tenant-{i}")).collect();
    Subjects {
        tenants: broker.resource_handle("tenants").unwrap(),
        broker,
        store: MemoryBackend::new()
            .states(
                "tenants",
                Arc::new(LimitSpec::new(&limits, Duration::from_secs(60))),
            )
            .expect("the in-memory store holds its states in process"),
        direct: RateLimiter::direct(quota),
        keyed: RateLimiter::dashmap(quota),
        keys,
    }
}

/// Polls our `try_acquire` to completion. The in-memory backend answers on
/// the first poll; anything else is a bench bug.
fn ours(broker: &ResourceBroker, target: impl Into<broker_core::Target<'static>>) -> bool {
    broker
        .try_acquire(target, Cost::default())
        .now_or_never()
        .expect("the in-memory backend answers at once")
        .expect("registered resource")
        .allowed
}

/// The store's own decision on sub-key `i`.
fn store(s: &Subjects, i: usize) -> bool {
    s.store
        .try_acquire(Some(&s.keys[i]), Cost::default())
        .allowed
}

/// Our keyed `try_acquire` through the pre-resolved handle.
fn ours_handle(tenants: &ResourceHandle, key: &str) -> bool {
    tenants
        .try_acquire(key, Cost::default())
        .now_or_never()
        .expect("the in-memory backend answers at once")
        .expect("registered resource")
        .allowed
}

/// The handle's synchronous call (the one a tower service makes).
fn ours_handle_now(tenants: &ResourceHandle, key: &str) -> bool {
    tenants
        .try_acquire_now(key, Cost::default())
        .expect("the in-memory backend answers at once")
        .expect("registered resource")
        .allowed
}

/// Our keyed `try_acquire_now` on `("tenants", key)`.
fn ours_keyed_now(broker: &ResourceBroker, key: &str) -> bool {
    broker
        .try_acquire_now(("tenants", key), Cost::default())
        .expect("the in-memory backend answers at once")
        .expect("registered resource")
        .allowed
}

/// `iters` calls `call(i)`, each awaited inside one async block that is
/// polled once; the wall time.
fn awaited<F>(iters: u64, call: impl Fn(u64) -> F) -> Duration
where
    F: std::future::Future<Output = Result<broker_core::Acquisition, broker_core::BrokerError>>,
{
    let start = Instant::now();
    async {
        for i in 0..iters {
            black_box(call(i).await.expect("registered resource").allowed);
        }
    }
    .now_or_never()
    .expect("the in-memory backend answers at once");
    start.elapsed()
}

/// Our keyed `try_acquire` on `("tenants", key)`.
fn ours_keyed(broker: &ResourceBroker, key: &str) -> bool {
    broker
        .try_acquire(("tenants", key), Cost::default())
        .now_or_never()
        .expect("the in-memory backend answers at once")
        .expect("registered resource")
        .allowed
}

fn single_thread(c: &mut Criterion, mode: &str, s: &Subjects) {
    let mut g = c.benchmark_group(format!("{mode}/one_key"));
    g.bench_function("broker_try_acquire", |b| {
        b.iter(|| black_box(ours(&s.broker, "one")))
    });
    g.bench_function("governor_direct_check", |b| {
        b.iter(|| black_box(s.direct.check().is_ok()))
    });
    let one = s.keys[0].clone();
    g.bench_function("governor_keyed_check_key", |b| {
        b.iter(|| black_box(s.keyed.check_key(&one).is_ok()))
    });
    g.bench_function("broker_try_acquire_keyed", |b| {
        b.iter(|| black_box(ours_keyed(&s.broker, &one)))
    });
    g.bench_function("broker_try_acquire_now_keyed", |b| {
        b.iter(|| black_box(ours_keyed_now(&s.broker, &one)))
    });
    g.bench_function("broker_try_acquire_keyed_awaited", |b| {
        b.iter_custom(|n| {
            awaited(n, |_| {
                s.broker.try_acquire(("tenants", &*one), Cost::default())
            })
        })
    });
    g.bench_function("handle_try_acquire_keyed", |b| {
        b.iter(|| black_box(ours_handle(&s.tenants, &one)))
    });
    g.bench_function("handle_try_acquire_keyed_awaited", |b| {
        b.iter_custom(|n| awaited(n, |_| s.tenants.try_acquire(&*one, Cost::default())))
    });
    g.bench_function("handle_try_acquire_now_keyed", |b| {
        b.iter(|| black_box(ours_handle_now(&s.tenants, &one)))
    });
    g.bench_function("memory_local_states_try_acquire", |b| {
        b.iter(|| black_box(store(s, 0)))
    });
    g.finish();

    let mut g = c.benchmark_group(format!("{mode}/keys_10k"));
    g.bench_function("broker_try_acquire_keyed", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(ours_keyed(&s.broker, &s.keys[i]))
        })
    });
    g.bench_function("broker_try_acquire_now_keyed", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(ours_keyed_now(&s.broker, &s.keys[i]))
        })
    });
    g.bench_function("broker_try_acquire_keyed_awaited", |b| {
        b.iter_custom(|n| {
            awaited(n, |i| {
                let key = &*s.keys[i as usize % KEYS];
                s.broker.try_acquire(("tenants", key), Cost::default())
            })
        })
    });
    g.bench_function("handle_try_acquire_keyed", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(ours_handle(&s.tenants, &s.keys[i]))
        })
    });
    g.bench_function("handle_try_acquire_keyed_awaited", |b| {
        b.iter_custom(|n| {
            awaited(n, |i| {
                s.tenants
                    .try_acquire(&*s.keys[i as usize % KEYS], Cost::default())
            })
        })
    });
    g.bench_function("handle_try_acquire_now_keyed", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(ours_handle_now(&s.tenants, &s.keys[i]))
        })
    });
    g.bench_function("governor_keyed_check_key", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(s.keyed.check_key(&s.keys[i]).is_ok())
        })
    });
    g.bench_function("memory_local_states_try_acquire", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(store(s, i))
        })
    });
    g.finish();
}

/// Runs `f(thread, i)` for `iters` iterations on each of two threads at
/// once and returns the wall time.
fn two_threads(iters: u64, f: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..2 {
            let f = &f;
            scope.spawn(move || {
                for i in 0..iters {
                    f(t, i);
                }
            });
        }
    });
    start.elapsed()
}

fn threads2(c: &mut Criterion, s: &Subjects) {
    let one = s.keys[0].clone();
    let mut g = c.benchmark_group("threads2/one_key");
    g.throughput(Throughput::Elements(2));
    g.bench_function("broker_try_acquire", |b| {
        b.iter_custom(|n| {
            two_threads(n, |_, _| {
                black_box(ours(&s.broker, "one"));
            })
        })
    });
    g.bench_function("broker_try_acquire_keyed", |b| {
        b.iter_custom(|n| {
            two_threads(n, |_, _| {
                black_box(ours_keyed(&s.broker, &one));
            })
        })
    });
    g.bench_function("handle_try_acquire_keyed", |b| {
        b.iter_custom(|n| {
            two_threads(n, |_, _| {
                black_box(ours_handle(&s.tenants, &one));
            })
        })
    });
    g.bench_function("governor_keyed_check_key", |b| {
        b.iter_custom(|n| {
            two_threads(n, |_, _| {
                black_box(s.keyed.check_key(&one).is_ok());
            })
        })
    });
    g.bench_function("governor_direct_check", |b| {
        b.iter_custom(|n| {
            two_threads(n, |_, _| {
                black_box(s.direct.check().is_ok());
            })
        })
    });
    g.finish();

    // Each thread cycles through the keys from its own offset, so the two
    // mostly touch different keys (and often different shards).
    let key = |t: usize, i: u64| &s.keys[(t * KEYS / 2 + i as usize) % KEYS];
    let mut g = c.benchmark_group("threads2/keys_10k");
    g.throughput(Throughput::Elements(2));
    g.bench_function("broker_try_acquire_keyed", |b| {
        b.iter_custom(|n| {
            two_threads(n, |t, i| {
                black_box(ours_keyed(&s.broker, key(t, i)));
            })
        })
    });
    g.bench_function("handle_try_acquire_keyed", |b| {
        b.iter_custom(|n| {
            two_threads(n, |t, i| {
                black_box(ours_handle(&s.tenants, key(t, i)));
            })
        })
    });
    g.bench_function("governor_keyed_check_key", |b| {
        b.iter_custom(|n| {
            two_threads(n, |t, i| {
                black_box(s.keyed.check_key(key(t, i)).is_ok());
            })
        })
    });
    g.finish();
}

fn allow(c: &mut Criterion) {
    let s = subjects(1000, BIG_BURST);
    single_thread(c, "allow", &s);
    threads2(c, &s);
}

fn deny(c: &mut Criterion) {
    let s = subjects(1, 1);
    // Exhaust every state first, so the measured calls are denials.
    ours(&s.broker, "one");
    let _ = s.direct.check();
    for (i, k) in s.keys.iter().enumerate() {
        ours_keyed(&s.broker, k);
        let _ = s.keyed.check_key(k);
        store(&s, i);
    }
    assert!(!ours(&s.broker, "one"));
    assert!(!ours_keyed(&s.broker, &s.keys[7]));
    assert!(!ours_handle(&s.tenants, &s.keys[7]));
    assert!(s.keyed.check_key(&s.keys[7]).is_err());
    assert!(!store(&s, 7));
    single_thread(c, "deny", &s);
}

criterion_group!(benches, allow, deny);
criterion_main!(benches);
