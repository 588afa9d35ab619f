//! Concurrency slots: holding, releasing and renewing a lease.

use super::{Lease, LeaseId, LimitSpec, Micros, ResourceState};

fn purge_expired(leases: &mut Vec<Lease>, now: Micros) {
    leases.retain(|l| l.expires > now);
}

/// Takes a concurrency slot under `lease` if one is free. True when held
/// (always true without a concurrency limit).
pub fn take_slot(state: &mut ResourceState, spec: &LimitSpec, now: Micros, lease: LeaseId) -> bool {
    let Some(max) = spec.max_concurrent else {
        return true;
    };
    purge_expired(&mut state.leases, now);
    if state.leases.len() >= max as usize {
        return false;
    }
    state.leases.push(Lease {
        id: lease,
        expires: now.saturating_add(spec.lease_ttl),
    });
    true
}

/// `release`: frees the slot held under `lease`. Idempotent: releasing an
/// unknown or already released lease changes nothing and returns false.
/// Lease ids are unique, so the scan stops at the lease, and the last
/// lease takes its place (the order of leases means nothing).
pub fn release(state: &mut ResourceState, lease: LeaseId) -> bool {
    match state.leases.iter().position(|l| l.id == lease) {
        Some(i) => {
            state.leases.swap_remove(i);
            true
        }
        None => false,
    }
}

/// `renew`: extends `lease`, while it is live (held, and not expired at
/// `now`), to the spec's `lease_ttl` from `now`; true when it was live. An
/// expired lease is not brought back, even before a purge removes it: its
/// slot may be another holder's.
pub fn renew(state: &mut ResourceState, spec: &LimitSpec, now: Micros, lease: LeaseId) -> bool {
    match state.leases.iter_mut().find(|l| l.id == lease) {
        Some(l) if l.expires > now => {
            l.expires = now.saturating_add(spec.lease_ttl);
            true
        }
        _ => false,
    }
}
