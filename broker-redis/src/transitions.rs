//! The transitions: one `EVALSHA` per call (see [`crate::call`]); an
//! "unavailable" error when Redis cannot be reached.

use std::time::Duration;

use async_trait::async_trait;
use broker_core::clock::micros;
use broker_core::state::{DenyReason, MARKED};
use broker_core::stats::BackendHealth;
use broker_core::{
    BackendError, Booking, Cost, Decision, LeaseId, LimitSpec, Marks, Micros, ObservedLimit,
    Releases, Renewal, Store,
};
use redis::{Cmd, Value};
use tokio::time::Instant;

use crate::call::{micros_of, new_lease, parse, Failure, TakenReleases};
use crate::keys::KeyPair;
use crate::scripts::{self, Lua, Operand};
use crate::send::Takes;
use crate::RedisBackend;

impl RedisBackend {
    /// The call of `script`, a transition that takes `cost` in every
    /// bucket, with the bucket operands filled in.
    fn cost_call<'s>(
        &self,
        script: &'s Lua,
        keys: &KeyPair,
        spec: &LimitSpec,
        cost: Cost,
    ) -> (&'s Lua, Cmd) {
        let cmd = scripts::evalsha(
            script,
            keys,
            self.now_arg(),
            self.inner.margin_ms,
            spec,
            |i| Operand::Int(cost.of(spec.buckets[i].0)),
        );
        (script, cmd)
    }

    /// `take_slot` in Redis, under `lease`, answered by `deadline`: true
    /// when held. `fresh`: a new lease (`take_slot`), released if granted
    /// after the caller was told the call timed out; else a live permit's
    /// (`renew` taking it again), which its next renewal finds held.
    async fn take_slot_as(
        &self,
        key: &str,
        keys: &KeyPair,
        spec: &LimitSpec,
        (lease, fresh): (LeaseId, bool),
        deadline: Instant,
    ) -> Result<bool, Failure> {
        let mut cmd = scripts::evalsha(
            &scripts::TAKE_SLOT,
            keys,
            self.now_arg(),
            self.inner.margin_ms,
            spec,
            |_| Operand::Int(0),
        );
        match spec.max_concurrent {
            Some(max) => cmd.arg(max),
            None => cmd.arg(""),
        };
        cmd.arg(spec.lease_ttl).arg(lease);
        let leased = Some((keys.clone(), lease));
        let reply = match fresh {
            true => {
                self.run_decision(
                    self.scope(key),
                    &scripts::TAKE_SLOT,
                    cmd,
                    leased,
                    Takes::Slot,
                    deadline,
                )
                .await?
            }
            false => {
                let scope = self.scope(key);
                self.run_leased(scope, &scripts::TAKE_SLOT, cmd, leased, deadline)
                    .await?
            }
        };
        let held = parse::<i64>(reply)?;
        Ok(held == 1)
    }

    /// Sends the releases of `key` not yet sent (see `pending.rs`) ahead of a
    /// decision on it, by the decision's `deadline`, so it never overtakes
    /// them; false while Redis is down (they are kept, the policy answers).
    async fn send_pending_releases(&self, key: &str, deadline: Instant) -> bool {
        // Taken out, they are this call's to send: if it goes away first,
        // the rest are sent from a task (see `TakenReleases`). One that
        // cannot reach Redis is kept again, for the background probe.
        let mut taken = TakenReleases {
            backend: self,
            key,
            leases: self.inner.pending.take(key),
        };
        let scope = self.scope(key);
        loop {
            if self.inner.health.is_down(scope) {
                for lease in taken.leases.drain(..) {
                    self.keep_release(key, lease);
                }
                return false;
            }
            let Some(&lease) = taken.leases.last() else {
                return true;
            };
            let _ = self.release_by(key, lease, deadline).await;
            taken.leases.pop();
        }
    }

    /// [`Store::release`], answered by `deadline`.
    async fn release_by(
        &self,
        key: &str,
        lease: LeaseId,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        let keys = self.keys(key)?;
        let mut cmd = scripts::evalsha_no_buckets(&scripts::RELEASE, &keys);
        cmd.arg(lease);
        let scope = self.scope(key);
        let run = self.run_leased(scope, &scripts::RELEASE, cmd, None, deadline);
        let result = async { parse::<i64>(run.await?) }.await;
        match result {
            Ok(n) => Ok(n == 1),
            Err(f) => {
                // Sent once Redis answers again, not left to the lease's TTL.
                if let Failure::Unavailable(_) = f {
                    self.keep_release(key, lease);
                }
                Err(f.into())
            }
        }
    }

    async fn try_redis(
        &self,
        key: &str,
        keys: &KeyPair,
        spec: &LimitSpec,
        cost: Cost,
        lease: LeaseId,
        deadline: Instant,
    ) -> Result<Decision, Failure> {
        let (script, mut cmd) = self.cost_call(&scripts::TRY, keys, spec, cost);
        match spec.max_concurrent {
            Some(max) => cmd.arg(max),
            None => cmd.arg(""),
        };
        cmd.arg(spec.lease_ttl).arg(lease);
        // 1 when allowed; {reason, wait} when denied.
        let reply = self
            .run_try(
                self.scope(key),
                script,
                cmd,
                keys,
                spec.max_concurrent.map(|_| lease),
                deadline,
            )
            .await?;
        if let Value::Int(1) = reply {
            return Ok(Decision::allow(spec.max_concurrent.map(|_| lease)));
        }
        let (reason, wait): (i64, String) = parse(reply)?;
        Ok(match reason {
            2 => Decision::deny(DenyReason::Concurrency, 0),
            _ => Decision::deny(DenyReason::Rate, micros_of(&wait)?),
        })
    }

    /// `book`, also returning the store's time of the decision, so the
    /// wait can be turned into an absolute time on the store's clock
    /// (`now + wait`): the server's `TIME`, or the client clock.
    pub async fn book_at(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<(Booking, Micros), BackendError> {
        let keys = self.keys(key)?;
        Ok(self.book_redis(key, &keys, spec, cost, max_wait).await?)
    }

    async fn book_redis(
        &self,
        key: &str,
        keys: &KeyPair,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<(Booking, Micros), Failure> {
        let (script, mut cmd) = self.cost_call(&scripts::BOOK, keys, spec, cost);
        cmd.arg(micros(max_wait));
        // The store's time alone when booked with no wait and no penalty;
        // else {booked, wait, now, mark 1, .., mark 4} (Marks).
        let (scope, deadline) = (self.scope(key), self.deadline());
        let reply = self
            .run_decision(scope, script, cmd, None, Takes::Book, deadline)
            .await?;
        if !matches!(reply, Value::Array(_)) {
            let now: String = parse(reply)?;
            let now = micros_of(&now)?;
            let booked = Booking {
                wait: 0,
                booked: true,
                since: Marks::uniform(now),
            };
            return Ok((booked, now));
        }
        type Reply = (i64, String, String, String, String, String, String);
        let (booked, wait, now, m1, m2, m3, m4): Reply = parse(reply)?;
        let marks = [
            micros_of(&m1)?,
            micros_of(&m2)?,
            micros_of(&m3)?,
            micros_of(&m4)?,
        ];
        let (wait, now) = (micros_of(&wait)?, micros_of(&now)?);
        Ok((
            Booking {
                wait,
                booked: booked == 1,
                since: Marks::new(now, marks).due_at(now.saturating_add(wait)),
            },
            now,
        ))
    }
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
        // One bound for the releases sent ahead and the decision.
        let deadline = self.deadline();
        let reached =
            spec.max_concurrent.is_none() || self.send_pending_releases(key, deadline).await;
        let lease = new_lease();
        let decided = if reached {
            self.try_redis(key, &keys, spec, cost, lease, deadline)
                .await
        } else {
            Err(self.kept_back(self.scope(key)))
        };
        Ok(decided?)
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
        let deadline = self.deadline();
        let reached = self.send_pending_releases(key, deadline).await;
        let lease = new_lease();
        let held = if reached {
            self.take_slot_as(key, &keys, spec, (lease, true), deadline)
                .await
        } else {
            Err(self.kept_back(self.scope(key)))
        };
        Ok(held?.then_some(lease))
    }

    async fn wait_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        let keys = self.keys(key)?;
        let (script, cmd) = self.cost_call(&scripts::PENALTY_LEFT, &keys, spec, cost);
        let result = async {
            let left: String = parse(self.run(self.scope(key), script, cmd).await?)?;
            micros_of(&left)
        };
        Ok(result.await?)
    }

    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        self.release_by(key, lease, self.deadline()).await
    }

    async fn renew(
        &self,
        key: &str,
        spec: &LimitSpec,
        lease: LeaseId,
    ) -> Result<Renewal, BackendError> {
        let keys = self.keys(key)?;
        let mut cmd =
            scripts::evalsha_leases(&scripts::RENEW, &keys, self.now_arg(), self.inner.margin_ms);
        cmd.arg(spec.lease_ttl).arg(lease);
        let result =
            async { parse::<i64>(self.run(self.scope(key), &scripts::RENEW, cmd).await?) }.await;
        if result? == 1 {
            return Ok(Renewal::Held);
        }
        // Not held: taken again under the same lease if a slot is free.
        let deadline = self.deadline();
        let held = self.take_slot_as(key, &keys, spec, (lease, false), deadline);
        Ok(match held.await? {
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
        let mut cmd = scripts::evalsha(
            &scripts::SETTLE,
            &keys,
            self.now_arg(),
            self.inner.margin_ms,
            spec,
            |i| {
                let u = spec.buckets[i].0;
                Operand::Num(booked.of(u) as f64 - actual.of(u) as f64)
            },
        );
        for i in 0..MARKED {
            match since {
                Some(marks) => cmd.arg(marks.of(i)),
                None => cmd.arg(""),
            };
        }
        match since {
            Some(marks) => cmd.arg(marks.due()),
            None => cmd.arg(""),
        };
        self.run(self.scope(key), &scripts::SETTLE, cmd).await?;
        Ok(())
    }

    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        penalty: Duration,
    ) -> Result<(), BackendError> {
        let keys = self.keys(key)?;
        let mut cmd = scripts::evalsha(
            &scripts::PENALIZE,
            &keys,
            self.now_arg(),
            self.inner.margin_ms,
            spec,
            |_| Operand::Int(0),
        );
        cmd.arg(micros(penalty));
        self.run(self.scope(key), &scripts::PENALIZE, cmd).await?;
        Ok(())
    }

    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError> {
        let keys = self.keys(key)?;
        let counter = |i: usize| broker_core::state::observed_for(spec, observed, i);
        let mut cmd = scripts::evalsha(
            &scripts::RECONCILE,
            &keys,
            self.now_arg(),
            self.inner.margin_ms,
            spec,
            |i| {
                counter(i)
                    .and_then(|o| o.remaining)
                    .map_or(Operand::None, Operand::Int)
            },
        );
        for i in 0..spec.buckets.len() {
            match counter(i).and_then(|o| o.reset) {
                Some(reset) => cmd.arg(micros(reset)),
                None => cmd.arg(""),
            };
        }
        self.run(self.scope(key), &scripts::RECONCILE, cmd).await?;
        Ok(())
    }

    fn health(&self) -> BackendHealth {
        self.inner.health.snapshot()
    }

    fn turns(&self) -> Option<&dyn broker_core::store::Turns> {
        Some(self)
    }

    fn releases(&self) -> Option<&dyn Releases> {
        Some(self)
    }
}

/// A decision may go out on another connection or in a batch ahead of a
/// release sent from a task: releases are kept pending (`pending.rs`) and
/// sent ahead of the next decision on their key.
#[async_trait]
impl Releases for RedisBackend {
    fn release_sent(&self, key: &str, lease: LeaseId) {
        self.inner.pending.add(key, lease);
    }

    fn release_unsent(&self, key: &str, lease: LeaseId) {
        // The lease then expires after its TTL.
        self.inner.pending.remove(key, lease);
    }

    async fn release_announced(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        // A decision on the key took it out and sent it.
        if !self.inner.pending.contains(key, lease) {
            return Ok(true);
        }
        // Left here while it is on its way, so a decision meanwhile sends
        // it ahead of itself too rather than overtake it; kept if it could
        // not reach Redis (which `remove` leaves).
        let released = self.release(key, lease).await;
        self.inner.pending.remove(key, lease);
        released
    }
}
