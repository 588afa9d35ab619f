//! What an acquisition addresses: a resource, maybe a sub-key, and for
//! `enqueue` a priority, a flow and a deadline.

use std::time::Duration;

/// A registered resource, or one sub-key of it: sub-keys share the
/// resource's limits, each with its own state. The builder methods set how
/// an `enqueue` call waits; other calls ignore them.
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

/// The priority of an `enqueue` call: a higher one goes first, but a
/// lower level still gets one turn in [`Priority::MIN_SHARE`].
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
    /// A user is waiting: books at most four token intervals ahead.
    Interactive,
}

impl Priority {
    /// Every level, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Batch, Priority::Default, Priority::Interactive];

    /// One turn in this many goes to a waiting lower level.
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
    /// Sets the priority of an `enqueue` call.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the flow (tenant, API key, user), of weight 1.
    pub fn flow(self, flow: &'a str) -> Self {
        self.flow_weighted(flow, 1)
    }

    /// Sets the flow and its weight (0 is taken as 1): backlogged flows
    /// get turns in proportion to their weights.
    pub fn flow_weighted(mut self, flow: &'a str, weight: u32) -> Self {
        self.flow = Some((flow, weight.max(1)));
        self
    }

    /// Sets how long an `enqueue` call may wait for its turn.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }
}

impl<'a> From<&'a str> for Target<'a> {
    /// The whole resource, default priority, no flow, no deadline.
    fn from(resource: &'a str) -> Self {
        Self {
            resource,
            key: None,
            priority: Priority::Default,
            flow: None,
            deadline: None,
        }
    }
}

impl<'a> From<&'a String> for Target<'a> {
    fn from(resource: &'a String) -> Self {
        Self::from(resource.as_str())
    }
}

impl<'a> From<(&'a str, &'a str)> for Target<'a> {
    fn from((resource, key): (&'a str, &'a str)) -> Self {
        Self {
            key: Some(key),
            ..Self::from(resource)
        }
    }
}
