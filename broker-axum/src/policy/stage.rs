/// Which resource an admission is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The per-route override at this index.
    Route(u32),
    /// The per-service limit.
    Service,
    /// The per-tenant limit.
    Tenant,
    /// Two route/service stages (route index or [`SERVICE`]) for a path read
    /// two ways, in charging order.
    Both(u32, u32),
}

/// The service stage in [`Stage::Both`].
pub(super) const SERVICE: u32 = u32::MAX;

impl Stage {
    /// The `layer` field of log events.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Route(_) | Stage::Both(..) => "route",
            Stage::Service => "service",
            Stage::Tenant => "tenant",
        }
    }

    /// The stages this one is made of: itself, or the two of [`Stage::Both`].
    pub(crate) fn parts(self) -> impl Iterator<Item = Stage> {
        let at = |place: u32| match place {
            SERVICE => Stage::Service,
            i => Stage::Route(i),
        };
        let (first, second) = match self {
            Stage::Both(a, b) => (at(a), Some(at(b))),
            single => (single, None),
        };
        std::iter::once(first).chain(second)
    }

    /// This route/service stage in [`Stage::Both`]; `None` for any other.
    pub(super) fn place(self) -> Option<u32> {
        match self {
            Stage::Route(i) => Some(i),
            Stage::Service => Some(SERVICE),
            Stage::Tenant | Stage::Both(..) => None,
        }
    }
}
