//! [`Turns`]: the optional capability of a store shared by processes to
//! keep one turn ledger per state and priority level, so that weighted
//! flows of different processes split the state's sends by weight (fair
//! queuing by virtual time: a flow's served cost over its weight).

use std::time::Duration;

use async_trait::async_trait;

use crate::error::BackendError;

/// A flow's ask for a turn on one state (see [`Turns::turn`]).
///
/// ```
/// use broker_core::store::TurnAsk;
/// let ask = TurnAsk { level: 1, flow: "3f2a9c0d1b7e6a45", weight: 3, units: 100_000, last: false, active: std::time::Duration::from_secs(1) };
/// assert_eq!(ask.quantum(), 100_000.0 / 3.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnAsk<'a> {
    /// The priority level's index: one ledger per level.
    pub level: u8,
    /// The flow's fingerprint (never the caller's id).
    pub flow: &'a str,
    /// The flow's weight (at least 1).
    pub weight: u32,
    /// The call's cost as the time it refills in the slowest bucket, µs.
    pub units: u64,
    /// The call is its flow's last waiter in this process: once served,
    /// the flow leaves the ledger after `units` (so that it holds no other
    /// flow back), unless a waiter of it asks meanwhile.
    pub last: bool,
    /// How long a flow counts as active after its last ask: a flow not
    /// seen for this long leaves the ledger.
    pub active: Duration,
}

impl TurnAsk<'_> {
    /// The virtual time one such call adds to its flow: its cost over its
    /// weight.
    pub fn quantum(&self) -> f64 {
        self.units as f64 / f64::from(self.weight.max(1))
    }
}

/// The answer of [`Turns::turn`].
///
/// ```
/// use broker_core::store::Turn;
/// assert_ne!(Turn::Yours, Turn::NotYet);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The flow may book now; the call's cost is charged to it.
    Yours,
    /// Other flows are behind this one: ask again a little later.
    NotYet,
}

/// A turn ledger shared by every process on a store: for each active flow
/// of a state and level, its virtual time (served cost over weight). A
/// flow (re)joining starts at the least virtual time of the active flows;
/// a flow may book while its virtual time is at most that least one plus
/// one quantum of its call ([`TurnAsk::quantum`]), which then is charged.
/// Flows not seen for [`TurnAsk::active`] leave it, and so does one
/// whose last waiter was served, soon after ([`TurnAsk::last`]).
///
/// ```
/// # async fn demo(store: &dyn broker_core::Store) -> Result<(), broker_core::BackendError> {
/// use broker_core::store::{Turn, TurnAsk};
/// if let Some(turns) = store.turns() {
///     let ask = TurnAsk { level: 1, flow: "3f2a9c0d1b7e6a45", weight: 1, units: 100_000, last: false, active: std::time::Duration::from_secs(1) };
///     let mine = turns.turn("api", &ask).await? == Turn::Yours;
///     # let _ = mine;
/// }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Turns: Send + Sync {
    /// Whether `ask.flow` may book a call on state `key` now; if so, the
    /// call is charged to the flow, atomically with the answer.
    async fn turn(&self, key: &str, ask: &TurnAsk<'_>) -> Result<Turn, BackendError>;
}
