//! The [`Store`] transitions and the turn ledger of weighted flows
//! ([`Turns`], `lua/turn.lua`, on two sorted sets under the state's hash
//! tag): one `EVALSHA` each (see `call.rs`).

use std::time::Duration;

use async_trait::async_trait;
use broker_core::bucket::BucketParams;
use broker_core::clock::micros;
use broker_core::state::DenyReason;
use broker_core::stats::BackendHealth;
use broker_core::store::{Turn, TurnAsk, Turns};
use broker_core::{
    BackendError, Booking, Cost, Decision, LeaseId, LimitSpec, Marks, Micros, ObservedLimit,
    Renewal, Store, Unit,
};
use redis::{Cmd, Value};

use crate::call::{micros_of, parse, Takes};
use crate::keys::KeyPair;
use crate::scripts::{self, Lua};
use crate::RedisBackend;

impl RedisBackend {
    /// The call of `script` on `keys`, with `operand(i)` for each of
    /// `buckets` (see [`scripts::call`]).
    fn cmd(
        &self,
        script: &Lua,
        keys: [&str; 2],
        buckets: &[(Unit, BucketParams)],
        operand: impl FnMut(usize) -> Option<f64>,
    ) -> Cmd {
        let set = &self.inner.set;
        let now = set.clock.as_ref().map(|c| c.now());
        scripts::call(script, keys, now, set.margin_ms, buckets, operand)
    }

    /// The call of `script`, which takes `cost` in every bucket.
    fn cost_cmd(&self, script: &Lua, keys: &KeyPair, spec: &LimitSpec, cost: Cost) -> Cmd {
        self.cmd(script, keys.both(), &spec.buckets, |i| {
            Some(cost.of(spec.buckets[i].0) as f64)
        })
    }

    /// `take_slot` under `lease`: whether held. `fresh`: a new lease,
    /// released if granted after its caller timed out; else a live permit's
    /// (`renew`), which its next renewal finds held.
    async fn take_slot_as(
        &self,
        key: &str,
        keys: &KeyPair,
        spec: &LimitSpec,
        (lease, fresh): (LeaseId, bool),
    ) -> Result<bool, BackendError> {
        let mut cmd = self.cmd(&scripts::TAKE_SLOT, keys.both(), &[], |_| None);
        cmd.arg(spec.max_concurrent.map_or(String::new(), |m| m.to_string()));
        cmd.arg(spec.lease_ttl).arg(lease);
        let (leased, takes) = (Some((keys.clone(), lease)), fresh.then_some(Takes::Slot));
        let reply = self.call(key, &scripts::TAKE_SLOT, cmd, leased, takes);
        reply.await.map(|held: i64| held == 1)
    }

    /// `book`, with the store's time of the decision (the server's `TIME`,
    /// or the client clock), so the wait can be turned into an absolute
    /// time on the store's clock (`now + wait`).
    pub async fn book_at(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<(Booking, Micros), BackendError> {
        let keys = self.keys(key)?;
        let mut cmd = self.cost_cmd(&scripts::BOOK, &keys, spec, cost);
        cmd.arg(micros(max_wait));
        let reply = self.call(key, &scripts::BOOK, cmd, None, Some(Takes::Book));
        booking_of(reply.await?)
    }
}

/// A `book`'s reply, {booked, wait, now, mark 1, .., mark 4}, with the
/// store's time of the decision.
pub(crate) fn booking_of(reply: Value) -> Result<(Booking, Micros), BackendError> {
    let v: Vec<String> = parse(reply)?;
    let n = v.iter().skip(1).map(|s| micros_of(s));
    let n = n.collect::<Result<Vec<_>, _>>()?;
    let [wait, now, m1, m2, m3, m4] = n[..] else {
        return Err(BackendError::new(format!("unexpected book reply: {v:?}")));
    };
    let since = Marks::new(now, [m1, m2, m3, m4]).due_at(now.saturating_add(wait));
    let booked = v[0] == "1";
    let booking = Booking {
        wait,
        booked,
        since,
    };
    Ok((booking, now))
}

#[async_trait]
impl Store for RedisBackend {
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError> {
        let keys = self.keys(key)?;
        let lease: LeaseId = rand::random();
        let mut cmd = self.cost_cmd(&scripts::TRY, &keys, spec, cost);
        cmd.arg(spec.max_concurrent.map_or(String::new(), |m| m.to_string()));
        cmd.arg(spec.lease_ttl).arg(lease);
        let leased = spec.max_concurrent.map(|_| (keys, lease));
        let reply = self.call(key, &scripts::TRY, cmd, leased, Some(Takes::Try));
        let reply: Value = reply.await?;
        // 1 when allowed; {reason, wait} when denied.
        if let Value::Int(1) = reply {
            return Ok(Decision::allow(spec.max_concurrent.map(|_| lease)));
        }
        let (reason, wait): (i64, String) = parse(reply)?;
        Ok(match reason {
            2 => Decision::deny(DenyReason::Concurrency, 0),
            _ => Decision::deny(DenyReason::Rate, micros_of(&wait)?),
        })
    }

    async fn book(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Booking, BackendError> {
        Ok(self.book_at(key, spec, cost, max_wait).await?.0)
    }

    async fn take_slot(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Result<Option<LeaseId>, BackendError> {
        let keys = self.keys(key)?;
        let lease: LeaseId = rand::random();
        let held = self.take_slot_as(key, &keys, spec, (lease, true)).await?;
        Ok(held.then_some(lease))
    }

    async fn wait_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        let keys = self.keys(key)?;
        let cmd = self.cost_cmd(&scripts::PENALTY_LEFT, &keys, spec, cost);
        let left = self.call::<String>(key, &scripts::PENALTY_LEFT, cmd, None, None);
        micros_of(&left.await?)
    }

    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        let cmd = scripts::release(self.keys(key)?.both(), lease);
        let held: i64 = self.call(key, &scripts::RELEASE, cmd, None, None).await?;
        Ok(held == 1)
    }

    async fn renew(
        &self,
        key: &str,
        spec: &LimitSpec,
        lease: LeaseId,
    ) -> Result<Renewal, BackendError> {
        let keys = self.keys(key)?;
        let mut cmd = self.cmd(&scripts::RENEW, keys.both(), &[], |_| None);
        cmd.arg(spec.lease_ttl).arg(lease);
        let held: i64 = self.call(key, &scripts::RENEW, cmd, None, None).await?;
        if held == 1 {
            return Ok(Renewal::Held);
        }
        // Not held: taken again under the same lease if a slot is free.
        let retaken = self.take_slot_as(key, &keys, spec, (lease, false)).await?;
        Ok(match retaken {
            true => Renewal::Retaken,
            false => Renewal::Gone,
        })
    }

    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        booked: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError> {
        // Answered by a failure policy above the store: never charged here.
        if since == Some(Marks::ANSWERED_HERE) {
            return Ok(());
        }
        let keys = self.keys(key)?;
        let mut cmd = self.cmd(&scripts::SETTLE, keys.both(), &spec.buckets, |i| {
            let u = spec.buckets[i].0;
            Some(booked.of(u) as f64 - actual.of(u) as f64)
        });
        scripts::push_since(&mut cmd, since);
        self.call(key, &scripts::SETTLE, cmd, None, None).await
    }

    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        penalty: Duration,
    ) -> Result<(), BackendError> {
        let keys = self.keys(key)?;
        let mut cmd = self.cost_cmd(&scripts::PENALIZE, &keys, spec, Cost::requests(0));
        cmd.arg(micros(penalty));
        self.call(key, &scripts::PENALIZE, cmd, None, None).await
    }

    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError> {
        let keys = self.keys(key)?;
        let counter = |i: usize| broker_core::state::observed_for(spec, observed, i);
        let mut cmd = self.cmd(&scripts::RECONCILE, keys.both(), &spec.buckets, |i| {
            counter(i).and_then(|o| o.remaining).map(|r| r as f64)
        });
        for i in 0..spec.buckets.len() {
            let reset = counter(i).and_then(|o| o.reset);
            cmd.arg(reset.map_or(String::new(), |r| micros(r).to_string()));
        }
        self.call(key, &scripts::RECONCILE, cmd, None, None).await
    }

    fn health(&self) -> BackendHealth {
        self.inner.health.snapshot()
    }

    fn turns(&self) -> Option<&dyn Turns> {
        Some(self)
    }
}

#[async_trait]
impl Turns for RedisBackend {
    async fn turn(&self, key: &str, ask: &TurnAsk<'_>) -> Result<Turn, BackendError> {
        let [times, seen] = crate::keys::turn_keys(&self.inner.set.prefix, key, ask.level)?;
        let mut cmd = self.cmd(&scripts::TURN, [&times, &seen], &[], |_| None);
        cmd.arg(ask.flow)
            .arg(ask.weight.max(1))
            .arg(ask.units.max(1))
            .arg(micros(ask.active))
            .arg(if ask.last { "1" } else { "" });
        let yours: i64 = self.call(key, &scripts::TURN, cmd, None, None).await?;
        Ok(match yours {
            1 => Turn::Yours,
            _ => Turn::NotYet,
        })
    }
}
