//! Concurrency slots: holding, releasing and renewing a lease.

use super::{Lease, LeaseId, LimitSpec, Micros, ResourceState};

/// Takes a concurrency slot under `lease` if one is free. True when held
/// (always true without a concurrency limit).
pub fn take_slot(state: &mut ResourceState, spec: &LimitSpec, now: Micros, lease: LeaseId) -> bool {
    let Some(max) = spec.max_concurrent else {
        return true;
    };
    state.leases.retain(|l| l.expires > now);
    if state.leases.len() >= max as usize {
        return false;
    }
    state.leases.push(Lease {
        id: lease,
        expires: now.saturating_add(spec.lease_ttl),
    });
    true
}

/// Frees the slot held under `lease`; false if it was not held.
pub fn release(state: &mut ResourceState, lease: LeaseId) -> bool {
    let held = state.leases.iter().position(|l| l.id == lease);
    held.map(|i| state.leases.swap_remove(i)).is_some()
}

/// Extends a live `lease` to `lease_ttl` from `now`; an expired one is not
/// brought back (its slot may be another's).
pub fn renew(state: &mut ResourceState, spec: &LimitSpec, now: Micros, lease: LeaseId) -> bool {
    match state.leases.iter_mut().find(|l| l.id == lease) {
        Some(l) if l.expires > now => {
            l.expires = now.saturating_add(spec.lease_ttl);
            true
        }
        _ => false,
    }
}
