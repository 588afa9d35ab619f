//! The ADR-0048 table in virtual time: an upstream that refuses every
//! request for 15, 20 or 30 minutes (429, no headers, no Retry-After), a
//! 1/min bucket, three HTTP attempts per job run (`enqueue`), and a job
//! ladder of five runs. The ADR measured, with its minute ladder
//! (60 → 120 → 240 → 480 s between runs):
//!
//! | refusal | before (1/2/4/8 s ladder) | after (minute ladder) |
//! |---|---|---|
//! | 15 min | done at 15 min | done at 15 min |
//! | 20 min | failed at 15 min | done at 24 min |
//! | 30 min | failed at 15 min | failed at 26 min |
//!
//! Here the job does no work before it meets the closed window, so times
//! come out up to a minute earlier than the ADR's (whose runs spent minutes
//! on other pages first); with the second ladder even the 15-minute refusal
//! fails, at 14 minutes. Run with `--nocapture` to see every row.

mod upstream_support;

use std::time::Duration;

use broker_core::{
    Cost, EnqueueError, Limits, Outcome, OutcomeClass, RateLimit, ResourceConfig, RetryPolicy,
};
use broker_testkit::{HeaderStyle, Quota, Upstream, UpstreamConfig};
use tokio::time::Instant;
use upstream_support::{call, http_client, memory_broker, Headers};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    Done,
    Failed,
}

const MINUTE_LADDER: [u64; 4] = [60, 120, 240, 480];
const SECOND_LADDER: [u64; 4] = [1, 2, 4, 8];

/// One import job: up to five runs of one `enqueue` (three HTTP attempts),
/// with `ladder` seconds between runs. Returns the outcome and when it came.
async fn import_job(refusal_min: u64, ladder: [u64; 4]) -> (Job, Duration) {
    let upstream = Upstream::start(
        UpstreamConfig::new(Quota::per(1, Duration::from_secs(60)))
            .headers(HeaderStyle::None)
            .refuse_for(Duration::from_secs(refusal_min * 60)),
    )
    .await
    .unwrap();
    let broker = memory_broker();
    let policy = RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    broker
        .register(
            "sales",
            ResourceConfig {
                retry: policy,
                ..ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(1)))
            },
        )
        .unwrap();
    let http = http_client();
    let url = format!("{}/api/v1/supplier/sales", upstream.url());
    let start = Instant::now();
    // Five runs: a pause from the ladder after each of the first four.
    let pauses = ladder.iter().map(|s| Some(Duration::from_secs(*s)));
    for pause in pauses.chain([None]) {
        let r: Result<u64, EnqueueError<String>> = broker
            .enqueue("sales", Cost::default(), |_| {
                call(&http, &url, 0, Headers::Ignore)
            })
            .await;
        match (r, pause) {
            (Ok(_), _) => return (Job::Done, start.elapsed()),
            (Err(e), _) if !e.class().is_retryable() => return (Job::Failed, start.elapsed()),
            (Err(_), Some(pause)) => tokio::time::sleep(pause).await,
            (Err(_), None) => break,
        }
    }
    (Job::Failed, start.elapsed())
}

fn minutes(d: Duration) -> f64 {
    d.as_secs_f64() / 60.0
}

#[tokio::test(start_paused = true)]
async fn adr_0048_table_minute_ladder_outlasts_longer_refusals() {
    let adr_after = [
        (15, Job::Done, 15.0),
        (20, Job::Done, 24.0),
        (30, Job::Failed, 26.0),
    ];
    println!("refusal | before: 1/2/4/8 s ladder | after: 60/120/240/480 s ladder | ADR after");
    let mut rows = Vec::new();
    for (refusal, adr_job, adr_min) in adr_after {
        let before = import_job(refusal, SECOND_LADDER).await;
        let after = import_job(refusal, MINUTE_LADDER).await;
        println!(
            "{refusal:>4} min | {:?} at {:.1} min | {:?} at {:.1} min | {adr_job:?} at {adr_min} min",
            before.0,
            minutes(before.1),
            after.0,
            minutes(after.1)
        );
        rows.push((refusal, before, after, adr_job, adr_min));
    }
    for (refusal, before, after, adr_job, adr_min) in rows {
        assert_eq!(after.0, adr_job, "{refusal} min refusal");
        // Within a minute and a half of the ADR's simulation: ours has no
        // work before the terminal phase, so it may finish slightly earlier.
        assert!(
            (minutes(after.1) - adr_min).abs() <= 1.5,
            "{refusal} min refusal: {:.2} min against the ADR's {adr_min}",
            minutes(after.1)
        );
        if refusal > 15 {
            assert_eq!(
                before.0,
                Job::Failed,
                "{refusal} min: the second ladder gives up"
            );
            assert!(before.1 < after.1);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_fatal_error_ends_the_job_ladder_at_once() {
    let broker = memory_broker();
    broker
        .register(
            "sales",
            ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(1))),
        )
        .unwrap();
    let start = Instant::now();
    let mut attempts = 0;
    let r: Result<(), EnqueueError<&str>> = broker
        .enqueue("sales", Cost::default(), |_| {
            attempts += 1;
            async { Outcome::failed(OutcomeClass::Fatal, "401 token revoked", None) }
        })
        .await;
    let e = r.unwrap_err();
    assert!(!e.class().is_retryable(), "{e}");
    assert!(matches!(e, EnqueueError::Fatal { attempts: 1, .. }));
    assert_eq!(attempts, 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn retry_after_beyond_the_ceiling_is_capped_and_never_fails_the_wait() {
    // Refused for ten hours with Retry-After saying so; 60/min bucket:
    // the ceiling is max(60 s, 2 × 60 s + 1 s) = 121 s.
    let upstream = Upstream::start(
        UpstreamConfig::new(Quota::per(60, Duration::from_secs(60)))
            .retry_after(true)
            .refuse_for(Duration::from_secs(10 * 3600)),
    )
    .await
    .unwrap();
    let broker = memory_broker();
    broker
        .register(
            "api",
            ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(60))),
        )
        .unwrap();
    let http = http_client();
    let url = upstream.url();
    let start = Instant::now();
    let r: Result<u64, EnqueueError<String>> = broker
        .enqueue("api", Cost::default(), |_| {
            call(&http, &url, 0, Headers::Reconcile)
        })
        .await;
    let elapsed = start.elapsed();
    println!("10 h Retry-After, 121 s ceiling: {r:?} after {elapsed:?}");
    // The budget ran out (5 attempts), not the wait: every pause was capped
    // at the ceiling and every re-booking fit under it.
    match r {
        Err(EnqueueError::RetriesExhausted { attempts: 5, .. }) => {}
        other => panic!("expected an exhausted budget, got {other:?}"),
    }
    let ceiling = Duration::from_secs(121);
    assert!(
        elapsed <= ceiling * 4 + Duration::from_secs(1),
        "{elapsed:?}"
    );
    assert!(elapsed >= ceiling * 4, "{elapsed:?}");
    let stats = &broker.stats().resources["api"];
    assert_eq!(stats.upstream_429, 5);
    assert_eq!(stats.retries_exhausted, 1);
}
