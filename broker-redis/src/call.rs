//! Running one call: the health gate, one `EVALSHA` by a deadline, and its
//! outcome; an "unavailable" error when Redis cannot be reached.

use broker_core::{BackendError, LeaseId, Micros, Store};
use redis::{Cmd, Value};
use tokio::time::Instant;

use crate::connection::{self, redis_error};
use crate::health::{Epoch, Scope};
use crate::keys::{self, KeyPair};
use crate::scripts::Lua;
use crate::send::{Reply, Takes};
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

/// Releases a decision took out of the pending ones to send ahead of
/// itself: if the decision goes away first, those not yet sent are sent
/// from a task (a second send of one is harmless: `release` is idempotent).
pub(crate) struct TakenReleases<'a> {
    pub(crate) backend: &'a RedisBackend,
    pub(crate) key: &'a str,
    pub(crate) leases: Vec<LeaseId>,
}

impl Drop for TakenReleases<'_> {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.leases.is_empty() {
            return;
        }
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

    /// When a call starting now is answered at the latest.
    pub(crate) fn deadline(&self) -> Instant {
        crate::send::after(self.inner.response_timeout)
    }

    pub(crate) fn scope(&self, key: &str) -> Scope {
        Scope::of(&self.inner.conn, key)
    }

    /// Runs one script call on `key` within the response timeout.
    pub(crate) async fn run(
        &self,
        key: &str,
        script: &'static Lua,
        cmd: Cmd,
    ) -> Result<Value, BackendError> {
        self.call(key, script, cmd, None, None, self.deadline())
            .await
    }

    /// Runs one script call on `key` by `deadline`, unless its scope is down
    /// (the failure policy answers at once). `lease`: one the call may
    /// grant (see [`RedisBackend::send`]); `takes`: what a late reply
    /// gives back. A `try` is coalesced when coalescing is on.
    pub(crate) async fn call(
        &self,
        key: &str,
        script: &'static Lua,
        cmd: Cmd,
        lease: Option<(KeyPair, LeaseId)>,
        takes: Option<Takes>,
        deadline: Instant,
    ) -> Result<Value, BackendError> {
        let scope = self.scope(key);
        // Kept from Redis while its scope is down: the policy answers at once.
        let epoch = self
            .inner
            .health
            .should_try(scope)
            .ok_or_else(|| self.kept_back(scope))?;
        let reply = match takes {
            Some(Takes::Try) if self.inner.coalescer.settings.enabled => {
                self.coalesced(cmd, scope, lease, deadline).await
            }
            _ => self.send(script, cmd, lease, takes, deadline).await,
        };
        self.outcome(reply, scope, epoch)
    }

    /// A call on `scope` kept from Redis while that is down.
    pub(crate) fn kept_back(&self, scope: Scope) -> BackendError {
        self.inner.health.kept_back(scope);
        // Starts the probe again if its task was dropped with its runtime.
        self.watch();
        unreachable("redis is down (waiting for the probe to find it back)")
    }

    /// Keeps the release of `lease` on `key`, which could not reach Redis,
    /// for the next decision on `key` or the background probe.
    pub(crate) fn keep_release(&self, key: &str, lease: LeaseId) {
        if self.inner.pending.keep(key, lease) {
            self.watch();
        } else {
            tracing::debug!("too many releases kept while redis is out of reach; this one is left to its lease's ttl");
        }
    }

    /// Sorts a reply into a value, an outage of `scope` (unless one ended
    /// since `epoch`) or another error.
    fn outcome(&self, reply: Reply, scope: Scope, epoch: Epoch) -> Result<Value, BackendError> {
        let health = &self.inner.health;
        let msg = match reply {
            Reply::Done(Ok(v)) => {
                health.up(scope);
                return Ok(v);
            }
            Reply::Done(Err(e)) if !connection::is_unavailable(&e) => {
                if connection::answered_by_redis(&e) {
                    health.up(scope);
                }
                return Err(redis_error(e));
            }
            Reply::Done(Err(e)) => e.to_string(),
            Reply::TimedOut => format!("no reply within {:?}", self.inner.response_timeout),
            Reply::Unsent => {
                "redis is out of reach (a call sent before this one got no reply in time)".into()
            }
        };
        health.failed(scope, &msg, epoch);
        self.watch();
        Err(unreachable(msg))
    }
}
