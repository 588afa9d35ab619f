//! Registration: one resource at a time, or limit-only resources as one
//! step ([`ResourceBroker::register_limits`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Epochs, Lineage, Registry, Resource, ResourceBroker};
use crate::config::ResourceConfig;
use crate::error::ConfigError;
use crate::keys;
use crate::limits::Limits;
use crate::state::LimitSpec;
use crate::stats::{Counters, ResourceKind};
use crate::store::LocalStates;

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

/// A registration made ready outside the registry's lock.
struct Ready {
    id: String,
    config: ResourceConfig,
    kind: ResourceKind,
    key: String,
    spec: Arc<LimitSpec>,
    local: Option<Arc<dyn LocalStates>>,
}

/// Whether two limits decide alike: the same rates in the same order
/// (a burst left out is the amount) and the same concurrency limit.
fn same_limits(a: &Limits, b: &Limits) -> bool {
    a.max_concurrent == b.max_concurrent
        && a.rates.len() == b.rates.len()
        && a.rates.iter().zip(&b.rates).all(|(x, y)| {
            (x.amount, x.period, x.burst(), x.unit) == (y.amount, y.period, y.burst(), y.unit)
        })
}

/// `lease_ttl` on a store whose leases expire, if a live permit's lease
/// can be renewed before it expires.
fn renewable(lease_ttl: Duration) -> Result<Duration, ConfigError> {
    let least = super::keeper::MIN_LEASE_TTL;
    if lease_ttl < least {
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
    Ok(lease_ttl)
}

impl ResourceBroker {
    /// Registers limit-only resources, `(id, limits)` each, all or none.
    /// An id already held is kept as it is when it is limit-only with
    /// limits that decide alike, refused when it is a queue, and refused or
    /// re-configured as `on_other` says when its limits differ. An id named
    /// twice is refused. The error names the first entry refused.
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
    /// assert!(!broker.is_registered("c"));
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
        // Made ready before the lock, decided under it. What the lock's
        // guard is declared after is dropped once the lock is let go: a
        // store's states may register again from their destructor.
        let ready = (entries.iter().enumerate())
            .map(|(index, &(id, limits))| {
                let config = ResourceConfig::new(limits.clone());
                (self.ready(id, config, ResourceKind::LimitOnly))
                    .map_err(|error| EntryError { index, error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut replaced = Vec::new();
        let _guard = self.lock_registry();
        let current = self.inner.resources.load_full();
        let install = (ready.iter().enumerate())
            .map(|(index, r)| {
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
            .collect::<Result<Vec<bool>, _>>()?;
        if install.contains(&true) {
            let mut map = HashMap::clone(&current);
            for (r, _) in ready.iter().zip(install).filter(|(_, i)| *i) {
                replaced.extend(self.install(&mut map, r));
            }
            self.publish(map, &replaced);
        }
        Ok(())
    }

    /// Registers (or re-configures) `id` as a `kind` resource.
    pub(super) fn insert(
        &self,
        id: &str,
        config: ResourceConfig,
        kind: ResourceKind,
    ) -> Result<(), ConfigError> {
        let ready = self.ready(id, config, kind)?;
        // Dropped after the lock is let go (see `register_limits`).
        let replaced;
        let _guard = self.lock_registry();
        let mut map = HashMap::clone(&self.inner.resources.load());
        replaced = self.install(&mut map, &ready);
        self.publish(map, replaced.as_slice());
        Ok(())
    }

    /// The registry's lock: registrations are made one after another.
    fn lock_registry(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .register
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `id` and `config` and makes the store's states, before the
    /// registry's lock (a store's states may register from here).
    fn ready(
        &self,
        id: &str,
        config: ResourceConfig,
        kind: ResourceKind,
    ) -> Result<Ready, ConfigError> {
        if id.is_empty() || id.len() > 256 {
            return Err(ConfigError::BadResourceId(id.to_owned()));
        }
        config.validate()?;
        let key = keys::resource_key(id);
        let lease_ttl = match self.inner.backend.local().is_some() {
            true => Duration::MAX,
            false => renewable(config.lease_ttl)?,
        };
        let spec = Arc::new(LimitSpec::new(&config.paced_limits(), lease_ttl));
        let local = (self.inner.backend.local()).and_then(|l| l.states(&key, spec.clone()));
        Ok(Ready {
            id: id.to_owned(),
            config,
            kind,
            key,
            spec,
            local,
        })
    }

    /// Puts `ready` in `map` in place of its id's registration, returned;
    /// what belongs to the id is carried over.
    fn install(&self, map: &mut Registry, ready: &Ready) -> Option<Arc<Resource>> {
        let (penalties, lines, lineage, epochs, live) = match map.get(&ready.id) {
            Some(old) => (
                old.penalties.clone(),
                old.lines.clone(),
                old.lineage.clone(),
                old.epochs.after(&old.spec, &ready.spec),
                old.live.clone(),
            ),
            None => (
                Arc::default(),
                Arc::default(),
                Arc::new(Lineage::new(ready.spec.clone())),
                Epochs::default(),
                Arc::default(),
            ),
        };
        let resource = Arc::new(Resource {
            id: ready.id.clone(),
            local: ready.local.clone(),
            key: ready.key.clone(),
            spec: ready.spec.clone(),
            config: ready.config.clone(),
            kind: ready.kind,
            counters: Counters::default(),
            live,
            slot_notify: tokio::sync::Notify::new(),
            penalties,
            lines,
            warned_at_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            retired: std::sync::atomic::AtomicBool::new(false),
            keeper: self.inner.keeper.clone(),
            lineage,
            epochs,
        });
        resource.lineage.install(&resource);
        map.insert(ready.id.clone(), resource)
    }

    /// Makes `map` the registry and retires the registrations replaced.
    fn publish(&self, map: Registry, replaced: &[Arc<Resource>]) {
        self.inner.resources.store(Arc::new(map));
        for old in replaced {
            // After the store: a handle that sees the flag finds the new one.
            old.retired
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }
}
