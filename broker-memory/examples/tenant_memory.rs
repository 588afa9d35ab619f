//! The memory a million one-rate tenant states take in the store: the
//! process's resident set (`/proc/self/statm`, Linux) before and after one
//! request each of 1,000,000 new tenants at 10 a minute (none idle, under
//! the default bound: nothing folded).
//!
//! `cargo run --release -p broker-memory --example tenant_memory`

use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
use broker_memory::MemoryBackend;

/// Resident bytes of this process, if `/proc` tells.
fn resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn main() {
    const TENANTS: usize = 1_000_000;
    let backend = std::sync::Arc::new(MemoryBackend::new());
    let broker = ResourceBroker::from_arc(backend.clone());
    broker
        .register_limit("tenant", Limits::new().rate(RateLimit::per_minute(10)))
        .expect("a valid limit");
    let ids: Vec<String> = (0..TENANTS).map(|i| format!("~{i:032x}")).collect();
    let Some(before) = resident() else {
        eprintln!("no /proc/self/statm here");
        return;
    };
    for id in &ids {
        let decided = broker.try_acquire_now(("tenant", id.as_str()), Cost::default());
        assert!(decided.is_some_and(|d| d.is_ok_and(|a| a.allowed)));
    }
    let after = resident().unwrap_or(before);
    assert_eq!(backend.folded(), 0, "all held");
    let mib = (after.saturating_sub(before)) as f64 / f64::from(1 << 20);
    println!(
        "{TENANTS} tenant states (33-byte ids, one rate each): {mib:.0} MiB resident, {:.0} bytes each",
        (after.saturating_sub(before)) as f64 / TENANTS as f64
    );
}
