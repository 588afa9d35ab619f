//! Registration: one resource at a time ([`ResourceBroker::register`],
//! [`ResourceBroker::register_limit`]), or limit-only resources as one
//! step that refuses ids already taken ([`ResourceBroker::register_limits`]).

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

/// `lease_ttl` on a store whose leases expire, if the broker can renew a
/// live permit's lease before it does (see [`super::keeper`]).
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
    /// Registers limit-only resources, `(id, limits)` each, as one step:
    /// either every entry is registered or none is. An id the broker
    /// already holds is kept as it is (its state and counters too) when
    /// it is a limit-only resource whose limits decide alike, refused when
    /// it is a queue ([`ResourceBroker::register`]), and refused or
    /// re-configured as `on_other` says when its limits differ. An id
    /// named twice in one batch is refused. The error names the first
    /// entry that could not be registered.
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
        // Every entry made ready before the lock (a store's states may
        // register another resource from here), then decided on the
        // registry as it is under the lock: no entry is decided on a
        // registry that may change before it is installed.
        let ready = (entries.iter().enumerate())
            .map(|(index, &(id, limits))| {
                let config = ResourceConfig::new(limits.clone());
                (self.ready(id, config, ResourceKind::LimitOnly))
                    .map_err(|error| EntryError { index, error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let guard = self.lock_registry();
        let current = self.inner.resources.load_full();
        let decided = (ready.iter().enumerate())
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
            .collect::<Result<Vec<bool>, _>>();
        let install = match decided {
            Ok(install) => install,
            Err(e) => {
                // The prepared entries go once the lock is let go: a
                // store's states may register again from their destructor.
                drop(guard);
                drop(ready);
                return Err(e);
            }
        };
        let (mut replaced, mut unused) = (Vec::new(), Vec::new());
        if install.iter().any(|&i| i) {
            let mut map = HashMap::clone(&current);
            for (r, install) in ready.into_iter().zip(install) {
                match install {
                    true => replaced.extend(self.install(&mut map, r)),
                    false => unused.push(r),
                }
            }
            self.publish(map, &replaced);
        } else {
            // Every entry is there already as it would be: the registry
            // stays.
            unused = ready;
        }
        // Dropped once the lock is let go: a store's states may register
        // again from their destructor.
        drop(guard);
        drop((replaced, unused));
        Ok(())
    }

    /// Registers (or re-configures) `id` with `config` as a `kind`
    /// resource.
    pub(super) fn insert(
        &self,
        id: &str,
        config: ResourceConfig,
        kind: ResourceKind,
    ) -> Result<(), ConfigError> {
        let ready = self.ready(id, config, kind)?;
        let guard = self.lock_registry();
        let mut map = HashMap::clone(&self.inner.resources.load());
        let replaced = self.install(&mut map, ready);
        self.publish(map, replaced.as_slice());
        // Dropped once the lock is let go: a store's states may register
        // again from their destructor.
        drop(guard);
        drop(replaced);
        Ok(())
    }

    /// The registry's lock: registrations are made one after another.
    fn lock_registry(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .register
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `id` and `config` and makes what a registration needs from
    /// the store, before the registry's lock is taken: a store's states
    /// may register another resource from here.
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

    /// Puts `ready` in `map` (under the registry's lock), in place of the
    /// registration of its id there, which it returns.
    fn install(&self, map: &mut Registry, ready: Ready) -> Option<Arc<Resource>> {
        // The penalties, the latest registration and the count of the calls
        // queued and running belong to the resource id, not to one
        // registration: a call still running on an earlier registration
        // sees a penalty set through this one, and the other way round.
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
            local: ready.local,
            key: ready.key,
            spec: ready.spec,
            config: ready.config,
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
        map.insert(ready.id, resource)
    }

    /// Makes `map` the registry (under its lock) and retires the
    /// registrations it replaced.
    fn publish(&self, map: Registry, replaced: &[Arc<Resource>]) {
        self.inner.resources.store(Arc::new(map));
        for old in replaced {
            // After the new registry is stored: a handle that sees the
            // flag finds the new resource.
            old.retired
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }
}
