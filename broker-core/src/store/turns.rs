//! [`Turns`]: a turn ledger per state and priority level, shared by the
//! processes on a store, so weighted flows split sends by weight.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::BackendError;

/// A flow's ask for a turn on one state (see [`Turns::turn`]).
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
    /// The call is its flow's last waiter in this process: once served, the
    /// flow leaves the ledger after `units` unless it asks again.
    pub last: bool,
    /// How long a flow stays in the ledger after its last ask.
    pub active: Duration,
}

/// The answer of [`Turns::turn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The flow may book now; the call's cost is charged to it.
    Yours,
    /// Other flows are behind this one: ask again a little later.
    NotYet,
}

/// A turn ledger shared by every process on a store: each active flow's served
/// cost over weight. A joining flow starts at the least; a flow may book while
/// at most one quantum (`units / weight`) ahead of it, and is then charged.
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
