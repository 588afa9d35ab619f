//! Running one call: the health gate, one `EVALSHA` by a deadline, and its
//! outcome; an "unavailable" error when Redis cannot be reached.

use std::time::Duration;

use broker_core::{BackendError, LeaseId, Micros, Store};
use redis::{Cmd, Value};
use tokio::time::Instant;

use crate::connection::{self, redis_error};
use crate::health::{self, Scope};
use crate::keys::{self, KeyPair};
use crate::scripts::Lua;
use crate::send::{send_by, send_or_later, Late, Reply, Takes, Undo, Unsettled};
use crate::RedisBackend;

/// Why a call did not reach a decision in Redis.
pub(crate) enum Failure {
    /// Redis is unreachable: an "unavailable" error, which a failure
    /// policy above the store answers.
    Unavailable(String),
    /// A command or script error: returned as is.
    Other(BackendError),
}

impl From<Failure> for BackendError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Unavailable(why) => {
                BackendError::unavailable(format!("redis unreachable: {why}"))
            }
            Failure::Other(e) => e,
        }
    }
}

pub(crate) fn parse<T: redis::FromRedisValue>(v: Value) -> Result<T, Failure> {
    redis::from_redis_value(v)
        .map_err(|e| Failure::Other(BackendError::new(format!("unexpected script reply: {e}"))))
}

/// A wait or a time returned by a script as a string: `as Micros`,
/// saturating like the reference.
pub(crate) fn micros_of(s: &str) -> Result<Micros, Failure> {
    s.parse::<f64>()
        .map(|x| x as Micros)
        .map_err(|_| Failure::Other(BackendError::new(format!("bad number from script: {s:?}"))))
}

pub(crate) fn new_lease() -> LeaseId {
    rand::random()
}

/// The releases a decision took out of the pending ones to send ahead of
/// itself, not yet answered. Their tasks no longer send them (a decision
/// took them), so if the decision goes away first (its caller dropped
/// it), they are sent from a task of their own; one already on its way is
/// sent again, which `release`'s idempotence makes harmless.
pub(crate) struct TakenReleases<'a> {
    pub(crate) backend: &'a RedisBackend,
    pub(crate) key: &'a str,
    pub(crate) leases: Vec<LeaseId>,
}

impl Drop for TakenReleases<'_> {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        // Without a runtime (it is shutting down), the leases expire
        // after their TTL.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let key = self.key.to_owned();
        let leases = std::mem::take(&mut self.leases);
        runtime.spawn(async move {
            for lease in leases {
                let _ = backend.release(&key, lease).await;
            }
        });
    }
}

impl RedisBackend {
    pub(crate) fn keys(&self, key: &str) -> Result<KeyPair, BackendError> {
        keys::key_pair(&self.inner.prefix, key)
    }

    pub(crate) fn now_arg(&self) -> Option<Micros> {
        self.inner.clock.as_ref().map(|c| c.now())
    }

    /// When a call starting now is answered at the latest: the response
    /// timeout, the bound on how long any call waits, from now.
    pub(crate) fn deadline(&self) -> Instant {
        let now = Instant::now();
        // A timeout too long to add (`Duration::MAX`, "no limit"): a
        // deadline in 30 years, as tokio's own far future.
        now.checked_add(self.inner.response_timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
    }

    /// The part of the store the calls on state `key` need (see
    /// [`Scope`]): the server, or the hash slot of `key` on a cluster.
    pub(crate) fn scope(&self, key: &str) -> Scope {
        Scope::of(&self.inner.conn, key)
    }

    /// Runs one script call on `scope` (see [`Self::scope`]): one
    /// `EVALSHA` within the response timeout, unless the scope is down
    /// (the failure policy answers at once). (The scope, not the key, is
    /// passed down: each level of the call's future holds what it is
    /// given.)
    pub(crate) async fn run(&self, scope: Scope, script: &Lua, cmd: Cmd) -> Result<Value, Failure> {
        self.run_leased(scope, script, cmd, None, self.deadline())
            .await
    }

    /// [`Self::run`] answered by `deadline`, for a call that may grant
    /// `lease`: released if the call times out or is dropped before its
    /// answer.
    pub(crate) async fn run_leased(
        &self,
        scope: Scope,
        script: &Lua,
        cmd: Cmd,
        lease: Option<(KeyPair, LeaseId)>,
        deadline: Instant,
    ) -> Result<Value, Failure> {
        let epoch = self.gate(scope)?;
        let inner = &self.inner;
        let unsettled = Unsettled::new(&inner.conn, inner.response_timeout, lease);
        let reply = send_by(&inner.conn, deadline, script, &cmd).await;
        unsettled.settle(&reply);
        self.outcome(reply, scope, epoch)
    }

    /// [`Self::run_leased`] for a decision that `takes` something when
    /// granted: with no reply by `deadline` (the failure policy answers
    /// its caller), its late reply is still read, and what it took given
    /// back (see [`Late`]).
    pub(crate) async fn run_decision(
        &self,
        scope: Scope,
        script: &'static Lua,
        cmd: Cmd,
        lease: Option<(KeyPair, LeaseId)>,
        takes: Takes,
        deadline: Instant,
    ) -> Result<Value, Failure> {
        let epoch = self.gate(scope)?;
        let inner = &self.inner;
        let late = Late {
            takes,
            lease: lease.as_ref().map(|l| l.1),
            refund: inner.refund_late,
        };
        let unsettled = Unsettled::new(&inner.conn, inner.response_timeout, lease);
        let timeout = inner.response_timeout;
        let reply = send_or_later(&inner.conn, deadline, timeout, script, cmd, Undo::One(late));
        let reply = reply.await;
        unsettled.settle(&reply);
        self.outcome(reply, scope, epoch)
    }

    /// Runs a `try` call answered by `deadline`, coalesced with the
    /// concurrent ones when coalescing is on; else as
    /// [`Self::run_decision`]. `lease` is the lease the decision may be
    /// granted.
    pub(crate) async fn run_try(
        &self,
        scope: Scope,
        script: &'static Lua,
        cmd: Cmd,
        keys: &KeyPair,
        lease: Option<LeaseId>,
        deadline: Instant,
    ) -> Result<Value, Failure> {
        let lease = lease.map(|l| (keys.clone(), l));
        let Some(coalescer) = &self.inner.coalescer else {
            return self
                .run_decision(scope, script, cmd, lease, Takes::Try, deadline)
                .await;
        };
        let epoch = self.gate(scope)?;
        let reply = coalescer.run(script, cmd, scope, lease, deadline).await;
        self.outcome(reply, scope, epoch)
    }

    /// Lets a call on `scope` through to Redis, unless that is down: the
    /// health's epoch the call goes out in, for [`Self::outcome`].
    pub(crate) fn gate(&self, scope: Scope) -> Result<health::Epoch, Failure> {
        let inner = &self.inner;
        match inner.health.should_try(scope) {
            Some(epoch) => Ok(epoch),
            None => Err(self.kept_back(scope)),
        }
    }

    /// A call on `scope` kept from Redis while that is down: counted as
    /// handled by the failure policy, which answers it.
    pub(crate) fn kept_back(&self, scope: Scope) -> Failure {
        self.inner.health.kept_back(scope);
        // Starts the probe again if its task was dropped with its runtime.
        self.watch();
        Failure::Unavailable("redis is down (waiting for the probe to find it back)".into())
    }

    /// A call on `scope` reached Redis: ends that scope's outage, if any.
    pub(crate) fn reached(&self, scope: Scope) {
        self.inner.health.up(scope);
    }

    /// A call on `scope` could not reach Redis (`error`; it went out in
    /// `epoch`): starts an outage unless a call reached Redis since, and
    /// the background probe that ends it.
    pub(crate) fn failed(&self, scope: Scope, error: &str, epoch: health::Epoch) {
        let inner = &self.inner;
        inner.health.failed(scope, error, epoch);
        self.watch();
    }

    /// Keeps the release of `lease` on `key`, which could not reach
    /// Redis: sent ahead of the next decision on `key` here, or by the
    /// background probe once Redis answers (see `pending.rs`).
    pub(crate) fn keep_release(&self, key: &str, lease: LeaseId) {
        if self.inner.pending.keep(key, lease) {
            self.watch();
        } else {
            tracing::debug!("too many releases kept while redis is out of reach; this one is left to its lease's ttl");
        }
    }

    /// Sorts a reply into a value, an outage (recorded in the health of
    /// the call's `scope`) or another error. `epoch`: the health's when
    /// the call went out (an outage ended since then is not started again
    /// by its failure).
    pub(crate) fn outcome(
        &self,
        reply: Reply,
        scope: Scope,
        epoch: health::Epoch,
    ) -> Result<Value, Failure> {
        let inner = &self.inner;
        match reply {
            Reply::Done(Ok(v)) => {
                self.reached(scope);
                Ok(v)
            }
            Reply::Done(Err(e)) if connection::is_unavailable(&e) => {
                let msg = e.to_string();
                self.failed(scope, &msg, epoch);
                Err(Failure::Unavailable(msg))
            }
            Reply::Done(Err(e)) => {
                if connection::answered_by_redis(&e) {
                    self.reached(scope);
                }
                Err(Failure::Other(redis_error(e)))
            }
            Reply::TimedOut => {
                let msg = format!("no reply within {:?}", inner.response_timeout);
                self.failed(scope, &msg, epoch);
                Err(Failure::Unavailable(msg))
            }
            Reply::Unsent => {
                let msg =
                    "redis is out of reach (a call sent before this one got no reply in time)";
                self.failed(scope, msg, epoch);
                Err(Failure::Unavailable(msg.into()))
            }
        }
    }
}
