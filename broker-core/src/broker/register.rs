//! Registration: one resource at a time, or limit-only resources as one
//! step ([`ResourceBroker::register_limits`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::{Epochs, Latest, Registry, Resource, ResourceBroker};
use crate::config::ResourceConfig;
use crate::error::ConfigError;
use crate::keys;
use crate::limits::{Limits, RateLimit};
use crate::state::LimitSpec;
use crate::stats::{Counters, ResourceKind};

/// What [`ResourceBroker::register_limits`] does with an id the broker
/// already holds as a limit-only resource with other limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOtherLimits {
    /// Refuses the whole batch ([`ConfigError::Taken`]).
    Refuse,
    /// Re-configures the resource with the new limits (a reload).
    Replace,
}

/// The entry of a [`ResourceBroker::register_limits`] batch that could not
/// be registered; none of the batch was.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("entry {index}: {error}")]
pub struct EntryError {
    /// The entry's place in the batch.
    pub index: usize,
    /// Why it could not be registered.
    pub error: ConfigError,
}

/// Whether two limits decide alike: the same rates in the same order
/// (a burst left out is the amount) and the same concurrency limit.
fn same_limits(a: &Limits, b: &Limits) -> bool {
    let decides = |r: &RateLimit| (r.amount, r.period, r.burst(), r.unit);
    a.max_concurrent == b.max_concurrent
        && a.rates.iter().map(decides).eq(b.rates.iter().map(decides))
}

impl ResourceBroker {
    /// Registers limit-only resources, all or none. An id held with limits
    /// that decide alike is kept; a queue's is refused; one with other
    /// limits as `on_other` says. The error names the first entry refused.
    ///
    /// ```
    /// use broker_core::{Limits, OnOtherLimits, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::EntryError> {
    /// let broker = ResourceBroker::new(backend);
    /// let five = Limits::new().rate(RateLimit::per_second(5));
    /// let ten = Limits::new().rate(RateLimit::per_second(10));
    /// broker.register_limits(&[("a", &five), ("b", &five)], OnOtherLimits::Refuse)?;
    /// // "b" is taken with other limits: "c" is not registered either.
    /// let refused = broker.register_limits(&[("c", &five), ("b", &ten)], OnOtherLimits::Refuse);
    /// assert_eq!(refused.unwrap_err().index, 1);
    /// assert!(broker.limits("c").is_err());
    /// # Ok(()) }
    /// ```
    pub fn register_limits(
        &self,
        entries: &[(&str, &Limits)],
        on_other: OnOtherLimits,
    ) -> Result<(), EntryError> {
        let mut ids = std::collections::HashSet::with_capacity(entries.len());
        if let Some(index) = entries.iter().position(|(id, _)| !ids.insert(*id)) {
            let id = entries[index].0;
            let error = ConfigError::invalid(id, "named twice in one batch");
            return Err(EntryError { index, error });
        }
        // Made ready before the registry's lock, decided under it.
        let ready = (entries.iter().enumerate())
            .map(|(index, &(id, limits))| {
                let config = ResourceConfig::new(limits.clone());
                (self.ready(id, config, ResourceKind::LimitOnly))
                    .map_err(|error| EntryError { index, error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.commit(ready, |current, index, r| {
            let taken = |reason: &str| EntryError {
                index,
                error: ConfigError::Taken {
                    id: r.id.clone(),
                    reason: reason.to_owned(),
                },
            };
            match current.get(&r.id) {
                None => Ok(true),
                Some(old) if old.kind == ResourceKind::Queue => {
                    Err(taken("as a resource with a queue"))
                }
                Some(old) if same_limits(&old.config.limits, &r.config.limits) => Ok(false),
                Some(_) if on_other == OnOtherLimits::Refuse => Err(taken("with other limits")),
                Some(_) => Ok(true),
            }
        })
    }

    /// Installs, under the registry's lock, each of `ready` that `install`
    /// accepts (all or none), and retires the registrations replaced.
    pub(super) fn commit(
        &self,
        ready: Vec<Resource>,
        install: impl Fn(&Registry, usize, &Resource) -> Result<bool, EntryError>,
    ) -> Result<(), EntryError> {
        // Declared before the lock's guard, so dropped after it is let go:
        // a store's states may register again from their destructor.
        let (mut replaced, mut unused) = (Vec::new(), Vec::new());
        let _guard = self.inner.register.lock();
        let current = self.inner.resources.load_full();
        let installed = (ready.iter().enumerate())
            .map(|(index, r)| install(&current, index, r))
            .collect::<Result<Vec<bool>, _>>()?;
        if !installed.contains(&true) {
            return Ok(());
        }
        let mut map = HashMap::clone(&current);
        for (r, accepted) in ready.into_iter().zip(installed) {
            match accepted {
                true => replaced.extend(carry_over(&mut map, r)),
                false => unused.push(r),
            }
        }
        self.inner.resources.store(Arc::new(map));
        for old in &replaced {
            // After the store: a handle that sees the flag finds the new one.
            old.retired.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Checks `id` and `config` and makes the store's states, before the
    /// registry's lock (a store's states may register from here).
    pub(super) fn ready(
        &self,
        id: &str,
        config: ResourceConfig,
        kind: ResourceKind,
    ) -> Result<Resource, ConfigError> {
        if id.is_empty() || id.len() > 256 {
            return Err(ConfigError::BadResourceId(id.to_owned()));
        }
        config.validate()?;
        let key = keys::escape(id).into_owned();
        let store = self.inner.backend.local();
        // On a store whose leases expire, a live permit's lease must be
        // renewable before it expires.
        let (least, lease_ttl) = (super::keeper::MIN_LEASE_TTL, config.lease_ttl);
        if store.is_none() && lease_ttl < least {
            return Err(ConfigError::invalid(
                "leaseTtl",
                format!(
                    "must be at least {least:?} on a store shared by processes, whose leases \
                     expire (got {lease_ttl:?}): a live permit's lease is renewed every third \
                     of it, at most every {:?}",
                    least / 3
                ),
            ));
        }
        let lease_ttl = store.map_or(lease_ttl, |_| Duration::MAX);
        let spec = Arc::new(LimitSpec::new(&config.paced_limits(), lease_ttl));
        let local = store.and_then(|l| l.states(&key, spec.clone()));
        Ok(Resource {
            backend: self.inner.backend.clone(),
            local,
            live: Arc::default(),
            retired: AtomicBool::new(false),
            id: id.to_owned(),
            key,
            config,
            lineage: Arc::new(ArcSwap::from_pointee(Latest {
                spec: spec.clone(),
                epochs: Epochs::default(),
                resource: Weak::new(),
            })),
            spec,
            kind,
            counters: Counters::default(),
            slot_notify: tokio::sync::Notify::new(),
            slot_waiters: AtomicU64::new(0),
            penalties: Arc::default(),
            lines: Arc::default(),
            warned_at_ms: AtomicU64::new(u64::MAX),
            keeper: self.inner.keeper.clone(),
            epochs: Epochs::default(),
        })
    }
}

/// Puts `ready` in `map` in place of its id's registration, returned, and
/// makes it the latest of its id; what belongs to the id is carried over.
fn carry_over(map: &mut Registry, ready: Resource) -> Option<Arc<Resource>> {
    let resource = Arc::new(match map.get(&ready.id) {
        Some(old) => Resource {
            penalties: old.penalties.clone(),
            lines: old.lines.clone(),
            lineage: old.lineage.clone(),
            epochs: old.epochs.after(&old.spec, &ready.spec),
            live: old.live.clone(),
            ..ready
        },
        None => ready,
    });
    resource.lineage.store(Arc::new(Latest {
        spec: resource.spec.clone(),
        epochs: resource.epochs,
        resource: Arc::downgrade(&resource),
    }));
    map.insert(resource.id.clone(), resource)
}
