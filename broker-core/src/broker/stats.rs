//! The broker's stats: every resource's counters and the store's health.

use super::ResourceBroker;
use crate::stats::BrokerStats;

/// # Observability
impl ResourceBroker {
    /// Counters of every resource, and the state store's health (calls
    /// answered by its failure policy while it was unreachable). A
    /// resource's counts start at its latest registration (what happens
    /// since to a call made on a registration it replaced included, as in
    /// the metrics), save `queued` and `in_flight`, which also count the
    /// calls and permits still running on a registration it replaced.
    pub fn stats(&self) -> BrokerStats {
        let resources = self
            .inner
            .resources
            .load()
            .values()
            .map(|r| (r.id.clone(), r.stats()))
            .collect();
        BrokerStats {
            resources,
            backend: self.inner.backend.health(),
        }
    }
}
