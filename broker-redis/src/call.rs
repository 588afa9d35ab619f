//! Running one call: the health gate, one `EVALSHA` by a deadline, and its
//! outcome; a late decision's take is given back.

use std::time::Duration;

use broker_core::{BackendError, LeaseId, Micros};
use redis::{Cmd, RedisResult, Value};
use tokio::time::Instant;

use crate::connection::{self, redis_error};
use crate::health::Scope;
use crate::keys::{self, KeyPair};
use crate::scripts::{self, Lua};
use crate::transitions::booking_of;
use crate::RedisBackend;

/// The error of a call that could not reach Redis: the failure policy
/// above the store answers.
fn unreachable(why: impl std::fmt::Display) -> BackendError {
    BackendError::unavailable(format!("redis unreachable: {why}"))
}

pub(crate) fn parse<T: redis::FromRedisValue>(v: Value) -> Result<T, BackendError> {
    redis::from_redis_value(v)
        .map_err(|e| BackendError::new(format!("unexpected script reply: {e}")))
}

/// A wait or a time a script returned as a string, saturating like the
/// reference.
pub(crate) fn micros_of(s: &str) -> Result<Micros, BackendError> {
    s.parse::<f64>()
        .map(|x| x as Micros)
        .map_err(|_| BackendError::new(format!("bad number from script: {s:?}")))
}

impl RedisBackend {
    pub(crate) fn keys(&self, key: &str) -> Result<KeyPair, BackendError> {
        keys::key_pair(&self.inner.set.prefix, key)
    }

    /// Runs one script call on `key` within the response timeout, unless its
    /// scope is down (the failure policy answers); `takes` is what a late
    /// reply gives back; its reply read as a `T`. An outage of the scope
    /// starts unless one ended since the call went out.
    pub(crate) async fn call<T: redis::FromRedisValue>(
        &self,
        key: &str,
        script: &'static Lua,
        cmd: Cmd,
        lease: Option<(KeyPair, LeaseId)>,
        takes: Option<Takes>,
    ) -> Result<T, BackendError> {
        let (health, deadline) = (&self.inner.health, after(self.inner.set.response_timeout));
        let scope = Scope::of(&self.inner.conn, key);
        // Kept from Redis while its scope is down: the policy answers at once.
        let Some(epoch) = health.should_try(scope) else {
            // Starts the probe again if its task was dropped with its runtime.
            self.watch();
            return Err(unreachable(
                "redis is down (waiting for the probe to find it back)",
            ));
        };
        let reply = match takes {
            Some(Takes::Try) if self.inner.set.coalesce => {
                self.coalesced(cmd, scope, lease, deadline).await
            }
            _ => self.send(script, cmd, lease, takes, deadline).await,
        };
        let msg = match reply {
            Reply::Done(Err(e)) if connection::is_unavailable(&e) => e.to_string(),
            Reply::TimedOut => format!("no reply within {:?}", self.inner.set.response_timeout),
            Reply::Unsent => {
                "redis is out of reach (a call sent before this one got no reply in time)".into()
            }
            // A reply, or an error Redis itself answered, proves it up.
            Reply::Done(r) => {
                if r.as_ref().err().is_none_or(connection::answered_by_redis) {
                    health.up(scope);
                }
                return parse(r.map_err(redis_error)?);
            }
        };
        health.failed(scope, &msg, epoch);
        self.watch();
        Err(unreachable(msg))
    }
}

/// The answer to one call.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// The reply (an error raised by the call's script included).
    Done(RedisResult<Value>),
    /// No reply by the deadline.
    TimedOut,
    /// Not sent: a call before it on its scope timed out, so the failure
    /// policy answers it at once instead of after a timeout of its own.
    Unsent,
}

impl Reply {
    /// Whether the script may have run without its caller learning of it
    /// (no reply in time, a failed connection): a lease it may have granted
    /// is then released.
    pub(crate) fn unknown(&self) -> bool {
        matches!(self, Reply::Done(Err(e)) if connection::is_unavailable(e))
            || matches!(self, Reply::TimedOut)
    }

    /// Whether this is a granted `try` or `take_slot`.
    pub(crate) fn granted(&self) -> bool {
        matches!(self, Reply::Done(Ok(Value::Int(1))))
    }
}

/// How long a decision with no reply by its deadline is still waited for,
/// from a task, to give back what it took (see [`Undo`]).
pub(crate) const LATE: Duration = Duration::from_secs(30);

/// What a decision takes in Redis when granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Takes {
    /// A `try`: its cost, and its lease if it asks for one.
    Try,
    /// A `book`: its cost.
    Book,
    /// A `take_slot`: its lease.
    Slot,
}

/// What to give back if a call's reply comes late (see `give_back`): one
/// decision's, or each `try` of a coalesced batch's (their own calls and
/// leases, in the batch's order).
pub(crate) enum Undo {
    One(Takes, Option<LeaseId>),
    Batch(Vec<(Cmd, Option<LeaseId>)>),
}

/// `deadline` for a call starting now and lasting at most `timeout`.
pub(crate) fn after(timeout: Duration) -> Instant {
    // From the start of the broker's call, if it sent releases first.
    let now = broker_core::store::begun().unwrap_or_else(Instant::now);
    // `Duration::MAX` ("no limit"): 30 years, as tokio's own far future.
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

impl RedisBackend {
    /// `cmd`, an `EVALSHA` of `script`, answered by `deadline`. With no reply
    /// by then and an `undo`, a task waits up to [`LATE`] for the reply and
    /// gives back what it took (its calls each within the response timeout).
    pub(crate) async fn eval(
        &self,
        deadline: Instant,
        script: &'static Lua,
        cmd: Cmd,
        undo: Option<Undo>,
    ) -> Reply {
        let on = self.inner.conn.clone();
        let mut call = Box::pin(async move { (on.evalsha(script, &cmd).await, cmd) });
        let Ok((reply, _)) = tokio::time::timeout_at(deadline, &mut call).await else {
            // Without a runtime (it is shutting down), what it took stays.
            if let (Some(undo), Ok(runtime)) = (undo, tokio::runtime::Handle::try_current()) {
                let this = self.clone();
                runtime.spawn(async move {
                    let Ok((Ok(reply), cmd)) = tokio::time::timeout(LATE, call).await else {
                        return;
                    };
                    match undo {
                        Undo::One(takes, lease) => this.give_back(takes, lease, &cmd, reply).await,
                        // Each decision of a batch, from its own call.
                        Undo::Batch(decisions) => {
                            let Value::Array(items) = reply else { return };
                            if items.len() != decisions.len() {
                                return;
                            }
                            for (item, (cmd, lease)) in items.into_iter().zip(decisions) {
                                if let Ok(reply) = crate::coalesce::decision_reply(item) {
                                    this.give_back(Takes::Try, lease, &cmd, reply).await;
                                }
                            }
                        }
                    }
                });
            }
            return Reply::TimedOut;
        };
        Reply::Done(reply)
    }

    /// One `EVALSHA` within the response timeout, with nothing to give back.
    async fn send_within(&self, script: &'static Lua, cmd: Cmd) -> Reply {
        let call = self.inner.conn.evalsha(script, &cmd);
        match tokio::time::timeout(self.inner.set.response_timeout, call).await {
            Ok(r) => Reply::Done(r),
            Err(_) => Reply::TimedOut,
        }
    }

    /// Gives back what `reply`, the late reply to `cmd`, took after its
    /// caller was answered by the failure policy: its lease, which no caller
    /// holds, and its cost unless under fail-open (whose call went out).
    async fn give_back(&self, takes: Takes, lease: Option<LeaseId>, cmd: &Cmd, reply: Value) {
        // A granted `try` or `take_slot` (a `book` has no lease).
        let granted = matches!(reply, Value::Int(1));
        let lease = lease.filter(|_| granted);
        if let Some(undo) = lease.and_then(|l| scripts::release_of(cmd, l)) {
            self.send_within(&scripts::RELEASE, undo).await;
        }
        let refund = match takes {
            Takes::Try if granted => scripts::refund_of(cmd, None),
            Takes::Book => match booking_of(reply) {
                Ok((b, _)) if b.booked => scripts::refund_of(cmd, Some(b.since)),
                _ => None,
            },
            _ => None,
        };
        if let Some(undo) = refund.filter(|_| self.inner.set.refund_late) {
            if let Reply::Done(Err(e)) = self.send_within(&scripts::SETTLE, undo).await {
                tracing::debug!(error = %e, "giving back the cost of a timed-out decision failed");
            }
        }
    }

    /// Releases `lease` from a task, on the decision's connection so Redis
    /// runs it after the decision (else the lease expires after its TTL).
    pub(crate) fn release_later(&self, (keys, lease): (KeyPair, LeaseId)) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            let cmd = scripts::release(keys.both(), lease);
            if let Reply::Done(Err(e)) = this.send_within(&scripts::RELEASE, cmd).await {
                tracing::debug!(error = %e, "releasing the lease of a dropped or timed-out decision failed; it expires after its ttl");
            }
        });
    }

    /// Sends `cmd` by `deadline`. `lease`, which it may grant, is released
    /// unless the answer is known (also when the caller goes away first);
    /// with `takes`, what a late reply took is given back.
    pub(crate) async fn send(
        &self,
        script: &'static Lua,
        cmd: Cmd,
        lease: Option<(KeyPair, LeaseId)>,
        takes: Option<Takes>,
        deadline: Instant,
    ) -> Reply {
        let undo = takes.map(|takes| Undo::One(takes, lease.as_ref().map(|l| l.1)));
        let mut unsettled = Unsettled(self, lease);
        let reply = self.eval(deadline, script, cmd, undo).await;
        unsettled.1.take_if(|_| !reply.unknown());
        reply
    }
}

/// A lease a call in flight may grant, released when dropped unsettled.
struct Unsettled<'a>(&'a RedisBackend, Option<(KeyPair, LeaseId)>);

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.1.take() {
            self.0.release_later(lease);
        }
    }
}
