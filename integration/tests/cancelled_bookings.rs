//! Bookings cancelled at random points (issue 39): whatever is cancelled
//! when, the bookings that are sent leave no window of their send times
//! with more calls than the quota allows, as a strict upstream counts
//! them. On the in-memory store and on a real redis-server, in virtual
//! time.

mod common;
mod conformance;

use std::time::Duration;

use broker_core::{Booking, Clock, Cost, LimitSpec, Limits, Micros, RateLimit};
use broker_testkit::{StrictServer, Tally};
use common::cases::run_numbered;
use conformance::env::{self, Env};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Books one call, due whenever the store says.
    Book,
    /// Cancels the booking this picks among those not yet due.
    Cancel(prop::sample::Index),
}

/// A quota: burst, amount, period in µs.
type Quota = (u64, u64, u64);

fn quota() -> impl Strategy<Value = Quota> {
    (
        1u64..6,
        1u64..20,
        prop::sample::select(vec![100_000u64, 1_000_000]),
    )
}

fn steps() -> impl Strategy<Value = Vec<(Micros, Step)>> {
    let advance = prop_oneof![2 => Just(0u64), 3 => 0u64..300_000];
    let step = prop_oneof![
        3 => Just(Step::Book),
        2 => any::<prop::sample::Index>().prop_map(Step::Cancel),
    ];
    prop::collection::vec((advance, step), 1..60)
}

/// Whether every window `[a, b]` of the sorted `sends` holds at most
/// `burst + amount × (b − a) / period` calls (exact, in integers).
fn every_window_fits(sends: &[Micros], (burst, amount, period): Quota) -> bool {
    (0..sends.len()).all(|i| {
        (i..sends.len()).all(|j| {
            let calls = (j - i + 1) as u128;
            let span = (sends[j] - sends[i]) as u128;
            calls * period as u128 <= burst as u128 * period as u128 + amount as u128 * span
        })
    })
}

/// Runs `steps` on `key`, returning the send times of the bookings not
/// cancelled, from the first step's time.
async fn sends_after(
    env: &Env,
    key: &str,
    spec: &LimitSpec,
    steps: &[(Micros, Step)],
) -> Vec<Micros> {
    let b = &*env.backend;
    let one = Cost::requests(1);
    let start = env.clock.now();
    // (due, booking), of every booking not cancelled.
    let mut booked: Vec<(Micros, Booking)> = Vec::new();
    for &(advance, step) in steps {
        env.clock.advance(Duration::from_micros(advance));
        let now = env.clock.now();
        match step {
            Step::Book => {
                let r = b
                    .book(key, spec, one, Duration::from_secs(3600))
                    .await
                    .unwrap();
                assert!(r.booked);
                booked.push((now + r.wait, r));
            }
            Step::Cancel(pick) => {
                let pending: Vec<usize> =
                    (0..booked.len()).filter(|&i| booked[i].0 > now).collect();
                if pending.is_empty() {
                    continue;
                }
                let (_, r) = booked.remove(pending[pick.index(pending.len())]);
                b.settle(key, spec, one, Cost::requests(0), Some(r.since))
                    .await
                    .unwrap();
            }
        }
    }
    let mut sends: Vec<Micros> = booked.iter().map(|(due, _)| due - start).collect();
    sends.sort_unstable();
    sends
}

/// `PROPTEST_CASES` (else `cases`) random cases on `env`, each on a key
/// of its own.
fn run_cases(env: &Env, rt: &tokio::runtime::Runtime, cases: u32) {
    run_numbered(
        cases,
        &(quota(), steps()),
        |n, ((burst, amount, period), steps)| {
            let key = env.key(&format!("case-{n}"));
            let limits = Limits::new()
                .rate(RateLimit::per(amount, Duration::from_micros(period)).with_burst(burst));
            let spec = LimitSpec::new(&limits, Duration::from_secs(5));
            let sends = rt.block_on(sends_after(env, &key, &spec, &steps));
            let quota = (burst, amount, period);
            prop_assert!(every_window_fits(&sends, quota), "sends {:?}", sends);
            let tally = StrictServer::new(burst, amount, period).replay(&sends);
            let all = Tally {
                ok: sends.len() as u32,
                rejected: 0,
            };
            prop_assert_eq!(tally, all, "sends {:?}", sends);
            Ok::<(), TestCaseError>(())
        },
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn cancelled_bookings_leave_no_window_over_the_quota_in_memory() {
    let rt = runtime();
    let env = rt.block_on(env::memory("cancelled"));
    run_cases(&env, &rt, 256);
}

#[test]
fn cancelled_bookings_leave_no_window_over_the_quota_on_redis() {
    let rt = runtime();
    let env = rt.block_on(env::redis("cancelled"));
    run_cases(&env, &rt, 96);
}
