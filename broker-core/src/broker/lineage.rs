//! Lineage and epochs: what the registrations of one resource id share,
//! and how many of them changed its limits.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{enqueue, Resource};
use crate::state::LimitSpec;

/// What the registrations of one resource id share: the latest of them.
/// Each registration holds it, never the registrations after it, so one
/// kept alive by a call, a permit or a [`ResourceHandle`] made on it keeps
/// nothing else alive (before, it kept every later registration, and a
/// service that re-configured a resource every second grew without end).
#[derive(Debug)]
pub(crate) struct Lineage {
    pub(super) latest: ArcSwap<Latest>,
}

/// The latest registration of an id, as an earlier one sees it.
#[derive(Debug)]
pub(crate) struct Latest {
    /// Its limits.
    pub(crate) spec: Arc<LimitSpec>,
    /// Its changes of limits since the first registration of the id.
    pub(crate) epochs: Epochs,
    /// The registration (the registry holds it), whose counters count
    /// what happens to a call made on an earlier one.
    pub(super) resource: std::sync::Weak<Resource>,
}

/// How many registrations of an id, since its first, came with other
/// limits than the one before them (`limits`), and how many of those with
/// other buckets (`buckets`: other units, or another number of them).
/// Two registrations have the same limits (buckets) if and only if no
/// registration from the one to the other changed them: equal epochs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Epochs {
    pub(crate) limits: u64,
    pub(crate) buckets: u64,
}

impl Epochs {
    /// The epochs of a registration of `spec` made over one of `before`
    /// with these epochs.
    pub(crate) fn after(self, before: &Arc<LimitSpec>, spec: &Arc<LimitSpec>) -> Self {
        if Arc::ptr_eq(before, spec) || **before == **spec {
            return self;
        }
        Self {
            limits: self.limits + 1,
            buckets: self.buckets + u64::from(!enqueue::same_units(before, spec)),
        }
    }
}

impl Lineage {
    /// The lineage of a first registration, of `spec`, until
    /// [`Lineage::install`] names it.
    pub(crate) fn new(spec: Arc<LimitSpec>) -> Self {
        Self {
            latest: ArcSwap::from_pointee(Latest {
                spec,
                epochs: Epochs::default(),
                resource: std::sync::Weak::new(),
            }),
        }
    }

    /// Makes `resource` the latest registration of the id.
    pub(crate) fn install(&self, resource: &Arc<Resource>) {
        self.latest.store(Arc::new(Latest {
            spec: resource.spec.clone(),
            epochs: resource.epochs,
            resource: Arc::downgrade(resource),
        }));
    }
}
