//! The multi-process harness of the queue's Redis tests: a test re-runs its
//! own binary as worker processes that start their load at one wall time.

use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use broker_core::clock::micros;

/// The wall clock in µs (the clock the redis-server on loopback shares).
pub fn wall_us() -> u64 {
    micros(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// Runs this test's binary as one worker per role of `roles` (`RB_WORKER`,
/// with `RB_WORKER_ID`, `RB_URL`), all starting their load at `t0` (wall
/// µs in `RB_T0`, returned: a second and a half ahead, time to start and
/// connect). Returns each worker's stdout lines.
pub fn run_workers(test: &str, roles: &[&str], url: &str) -> (u64, Vec<Vec<String>>) {
    let exe = std::env::current_exe().expect("own test binary");
    let t0 = wall_us() + 1_500_000;
    let children: Vec<_> = roles
        .iter()
        .enumerate()
        .map(|(i, role)| {
            Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads", "1"])
                .env("RB_WORKER", role)
                .env("RB_WORKER_ID", i.to_string())
                .env("RB_URL", url)
                .env("RB_T0", t0.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn a worker process")
        })
        .collect();
    let outputs = children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().expect("worker output");
            assert!(out.status.success(), "a worker failed: {:?}", out.status);
            (String::from_utf8_lossy(&out.stdout).lines())
                .map(str::to_owned)
                .collect()
        })
        .collect();
    (t0, outputs)
}
