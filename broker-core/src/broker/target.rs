//! What an acquisition addresses: a registered resource, optionally one
//! sub-key of it (a tenant, a route, a credential fingerprint), and for
//! `enqueue` its place in the wait queue: a priority, a flow, a deadline.

use std::time::Duration;

/// A registered resource, or one sub-key of it. Sub-keys share the
/// resource's limits but each has its own state, created on first use and
/// evicted when idle. The builder methods set how an `enqueue` call waits
/// (see [`Priority`], [`Target::flow`], [`Target::deadline`]); other calls
/// ignore them.
///
/// ```
/// use broker_core::{Priority, Target};
/// use std::time::Duration;
/// let whole: Target = "webhooks".into();
/// let tenant: Target = ("tenants", "acme").into();
/// assert_eq!(whole.key, None);
/// assert_eq!(tenant.key, Some("acme"));
/// let batch = Target::from("openai")
///     .priority(Priority::Batch)
///     .flow_weighted("tenant-a", 3)
///     .deadline(Duration::from_secs(30));
/// assert_eq!(batch.flow, Some(("tenant-a", 3)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// The registered resource id.
    pub resource: &'a str,
    /// The sub-key, if any.
    pub key: Option<&'a str>,
    /// The priority of an `enqueue` call in this process's queue.
    pub priority: Priority,
    /// The flow (tenant, API key, user) of an `enqueue` call and its
    /// weight: flows of one priority are served fairly, by weight.
    pub flow: Option<(&'a str, u32)>,
    /// How long an `enqueue` call may wait for its turn; `None`: the
    /// resource's `queue_deadline`, if any, else as long as it is queued.
    pub deadline: Option<Duration>,
}

/// The priority of an `enqueue` call: a higher one gets its turn before
/// every queued lower one in this process. A lower level still gets one
/// turn in [`Priority::MIN_SHARE`] while higher ones are backlogged, given
/// to its longest-waiting call.
///
/// ```
/// use broker_core::Priority;
/// assert!(Priority::Interactive > Priority::Default);
/// assert!(Priority::Default > Priority::Batch);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Bulk work that may wait: books at most one token interval ahead.
    Batch,
    /// The default: books at most two token intervals ahead.
    #[default]
    Default,
    /// A user is waiting: books at most four token intervals ahead (so a
    /// backlog of them leaves lower levels their share).
    Interactive,
}

impl Priority {
    /// Every level, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Batch, Priority::Default, Priority::Interactive];

    /// One turn in this many goes to a lower level that waits while higher
    /// ones are backlogged.
    pub const MIN_SHARE: u32 = 10;

    /// The level's name, as stats show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Batch => "batch",
            Priority::Default => "default",
            Priority::Interactive => "interactive",
        }
    }

    /// The level's index in [`Priority::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl<'a> Target<'a> {
    /// The whole resource, default priority, no flow, no deadline.
    pub fn new(resource: &'a str) -> Self {
        Self {
            resource,
            key: None,
            priority: Priority::Default,
            flow: None,
            deadline: None,
        }
    }

    /// Sets the priority of an `enqueue` call.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the flow (tenant, API key, user), of weight 1. Kept only as a
    /// fingerprint.
    pub fn flow(self, flow: &'a str) -> Self {
        self.flow_weighted(flow, 1)
    }

    /// Sets the flow and its weight (0 is taken as 1): while flows are
    /// backlogged, each gets turns in proportion to its weight.
    pub fn flow_weighted(mut self, flow: &'a str, weight: u32) -> Self {
        self.flow = Some((flow, weight.max(1)));
        self
    }

    /// Sets how long an `enqueue` call may wait for its turn before it
    /// ends in `WaitTooLong` (bound `Deadline`).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The sub-key of the resource's state.
    pub(crate) fn keyed(resource: &'a str, key: Option<&'a str>) -> Self {
        Self {
            key,
            ..Self::new(resource)
        }
    }
}

impl<'a> From<&'a str> for Target<'a> {
    fn from(resource: &'a str) -> Self {
        Self::new(resource)
    }
}

impl<'a> From<&'a String> for Target<'a> {
    fn from(resource: &'a String) -> Self {
        Self::new(resource)
    }
}

impl<'a> From<(&'a str, &'a str)> for Target<'a> {
    fn from((resource, key): (&'a str, &'a str)) -> Self {
        Self::keyed(resource, Some(key))
    }
}
