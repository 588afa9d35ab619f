//! A resource the layers acquire on, and registration errors.

use std::borrow::Cow;
use std::sync::Arc;

use broker_core::{ConfigError, EntryError, Limits, OnOtherLimits, ResourceBroker, ResourceHandle};

use crate::response::RateHeaders;

/// A resource the layer acquires on, with its rate-limit headers.
#[derive(Debug, Clone)]
pub(crate) struct Limited {
    pub(crate) id: Arc<str>,
    pub(crate) handle: ResourceHandle,
    pub(crate) headers: RateHeaders,
}

/// A resource of a config before registration, with the field naming it.
pub(super) struct Wanted<'c> {
    pub(super) field: String,
    pub(super) id: String,
    pub(super) limits: &'c Limits,
}

/// The error of [`ResourceBroker::register_limits`] on `wanted`, naming
/// the field that gives the id.
pub(super) fn not_registered(
    error: EntryError,
    wanted: &[&Wanted<'_>],
    on_other: OnOtherLimits,
) -> ConfigError {
    let Some(w) = wanted.get(error.index) else {
        return error.error;
    };
    match error.error {
        taken @ ConfigError::Taken { .. } => {
            let reload = match on_other {
                OnOtherLimits::Refuse => ", or build with Pressure::reload to re-configure it",
                OnOtherLimits::Replace => "",
            };
            ConfigError::invalid(
                &w.field,
                format!("{taken} (another config's, or the application's own): give it an id of its own{reload}"),
            )
        }
        other => other,
    }
}

impl Limited {
    /// The headers of the limits now in force (rebuilt after a reload).
    pub(crate) fn headers(&self, broker: &ResourceBroker) -> Cow<'_, RateHeaders> {
        if self.handle.is_current() {
            return Cow::Borrowed(&self.headers);
        }
        match broker.limits(&self.id) {
            Ok(limits) => Cow::Owned(RateHeaders::new(&self.id, &limits)),
            Err(_) => Cow::Borrowed(&self.headers),
        }
    }

    pub(super) fn on(
        broker: &ResourceBroker,
        id: &str,
        limits: &Limits,
    ) -> Result<Self, ConfigError> {
        let handle = broker
            .resource_handle(id)
            .map_err(|e| ConfigError::invalid(id, e.to_string()))?;
        Ok(Self {
            id: id.into(),
            handle,
            headers: RateHeaders::new(id, limits),
        })
    }
}
