//! Sending one call to Redis: answered by a deadline, with what a late
//! reply took given back (its lease, and its cost when the policy says so),
//! and a lease whose outcome is unknown released.

use std::time::Duration;

use broker_core::state::MARKED;
use broker_core::LeaseId;
use redis::{Cmd, RedisResult, Value};
use tokio::time::Instant;

use crate::connection::Conn;
use crate::keys::KeyPair;
use crate::scripts::{self, Lua};

/// The answer to one decision: the script's reply or error, or no reply
/// within the timeout.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// The reply (an error raised by this decision's script included).
    Done(RedisResult<Value>),
    /// No reply within the response timeout.
    TimedOut,
    /// Not sent: a call in flight on its scope when it queued got no
    /// reply within the timeout, so it is answered as a new call would be
    /// then, by the failure policy, instead of waiting out a timeout of its
    /// own behind the ones before it.
    Unsent,
}

impl Reply {
    /// Whether the call's script may have run without its caller learning
    /// of it: no reply in time, or the connection failed under it (a
    /// timeout of the connection's own, a reset). A lease it may have
    /// granted is then released.
    pub(crate) fn unknown(&self) -> bool {
        match self {
            Reply::TimedOut => true,
            Reply::Done(Err(e)) => crate::connection::is_unavailable(e),
            Reply::Done(Ok(_)) | Reply::Unsent => false,
        }
    }
}

/// Releases `lease` from a task of its own: its holder went away, or never
/// learnt whether it was granted (no reply in time, and its script may
/// still run). Sent through the same connection as the decision: where
/// that connection is still the one the decision went on, Redis runs the
/// release after the decision's script. Where it is not (the manager
/// reconnected meanwhile), the release may arrive first, and a lease the
/// late script then grants expires after its TTL, as it does without a
/// runtime or when the release fails.
pub(crate) fn release_later(conn: &Conn, timeout: Duration, (keys, lease): (KeyPair, LeaseId)) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let conn = conn.clone();
    runtime.spawn(async move {
        let mut cmd = scripts::evalsha_no_buckets(&scripts::RELEASE, &keys);
        cmd.arg(lease);
        if let Reply::Done(Err(e)) = send(&conn, timeout, &scripts::RELEASE, &cmd).await {
            tracing::debug!(error = %e, "releasing the lease of a dropped or timed-out decision failed; it expires after its ttl");
        }
    });
}

/// A lease a decision in flight may be granted, released (by
/// [`release_later`]) unless the decision's answer is known: when the
/// caller goes away first, or the outcome is unknown (no reply in time, a
/// failed connection).
pub(crate) struct Unsettled<'a> {
    conn: &'a Conn,
    timeout: Duration,
    lease: Option<(KeyPair, LeaseId)>,
}

impl<'a> Unsettled<'a> {
    pub(crate) fn new(
        conn: &'a Conn,
        timeout: Duration,
        lease: Option<(KeyPair, LeaseId)>,
    ) -> Self {
        Self {
            conn,
            timeout,
            lease,
        }
    }

    /// The answer came (`reply`): the lease is the caller's to keep or
    /// release, unless the outcome is unknown.
    pub(crate) fn settle(mut self, reply: &Reply) {
        if !reply.unknown() {
            self.lease = None;
        }
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            release_later(self.conn, self.timeout, lease);
        }
    }
}

/// Whether `reply` is an allowed `try` (which holds its lease, if any).
pub(crate) fn granted(reply: &Reply) -> bool {
    matches!(reply, Reply::Done(Ok(Value::Int(1))))
}

/// How long a decision that got no reply within the response timeout is
/// still waited for, on a task of its own, so that what Redis took for it
/// when it ran late is given back (see [`Late`]). A decision Redis runs
/// later still keeps what it took (a lease until its TTL).
pub(crate) const LATE: Duration = Duration::from_secs(30);

/// What a decision takes in Redis when it is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Takes {
    /// A `try`: its cost, and its lease if it asks for one.
    Try,
    /// A `book`: its cost.
    Book,
    /// A `take_slot`: its lease.
    Slot,
}

/// What to give back of a decision that Redis granted after its caller
/// was told it got no reply in time (and was answered by the failure
/// policy: denied, counted in the local fallback, or let through open):
/// its lease, which no caller holds, and, when `refund`, its cost, which
/// paid for no call that went out under Redis's count (fail-closed denied
/// it; the local fallback counted it, or denied it, itself). Fail-open
/// keeps the cost in Redis: the call went out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Late {
    pub(crate) takes: Takes,
    pub(crate) lease: Option<LeaseId>,
    pub(crate) refund: bool,
}

impl Late {
    /// Gives back what `reply`, the late reply to `cmd`, took.
    pub(crate) async fn give_back(self, conn: &Conn, timeout: Duration, cmd: &Cmd, reply: &Value) {
        let granted = |v: &Value| matches!(v, Value::Int(1));
        let refund = match (self.takes, reply) {
            (Takes::Slot, v) => {
                if granted(v) {
                    self.release(conn, timeout, cmd).await;
                }
                return;
            }
            (Takes::Try, v) if granted(v) => {
                self.release(conn, timeout, cmd).await;
                scripts::refund_of(cmd, [b""; MARKED], b"")
            }
            (Takes::Try, _) => return,
            // Booked with no wait and no penalty: the store's time alone.
            (Takes::Book, Value::BulkString(now)) => {
                scripts::refund_of(cmd, [now.as_slice(); MARKED], now)
            }
            // {booked, wait, now, mark 1, .., mark 4}
            (Takes::Book, Value::Array(items)) => match items.as_slice() {
                [Value::Int(1), wait, now, rest @ ..] => {
                    let mut marks = [&b""[..]; MARKED];
                    for (m, v) in marks.iter_mut().zip(rest) {
                        if let Value::BulkString(b) = v {
                            *m = b;
                        }
                    }
                    let due = due_of(wait, now).map(|d| d.to_string());
                    scripts::refund_of(cmd, marks, due.as_deref().unwrap_or("").as_bytes())
                }
                _ => return,
            },
            (Takes::Book, _) => return,
        };
        if let Some(undo) = refund.filter(|_| self.refund) {
            if let Reply::Done(Err(e)) = send(conn, timeout, &scripts::SETTLE, &undo).await {
                tracing::debug!(error = %e, "giving back the cost of a timed-out decision failed");
            }
        }
    }

    async fn release(&self, conn: &Conn, timeout: Duration, cmd: &Cmd) {
        if let Some(undo) = self.lease.and_then(|l| scripts::release_of(cmd, l)) {
            let _ = send(conn, timeout, &scripts::RELEASE, &undo).await;
        }
    }
}

/// A booking's due time on the store's clock, `now + wait`, from the
/// strings of a `book`'s reply.
fn due_of(wait: &Value, now: &Value) -> Option<u64> {
    let num = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()?
            .parse::<f64>()
            .ok()
            .map(|x| x as u64),
        _ => None,
    };
    Some(num(now)?.saturating_add(num(wait)?))
}

/// What to give back if a call's reply comes late: one decision's, or
/// each of a coalesced batch's (their own calls, in the batch's order).
pub(crate) enum Undo {
    One(Late),
    Batch(Vec<(Cmd, Late)>),
}

/// A decision's `EVALSHA` (`cmd`, of `script`) answered by `deadline`; with
/// no reply by then, a task waits up to [`LATE`] for it and gives back what
/// it took (each call within `timeout`, see [`Late`]).
pub(crate) async fn send_or_later(
    conn: &Conn,
    deadline: Instant,
    timeout: Duration,
    script: &'static Lua,
    cmd: Cmd,
    undo: Undo,
) -> Reply {
    let on = conn.clone();
    let mut call = Box::pin(async move {
        let reply = on.evalsha(script, &cmd).await;
        (reply, cmd)
    });
    match tokio::time::timeout_at(deadline, &mut call).await {
        Ok((reply, _)) => Reply::Done(reply),
        Err(_) => {
            // Without a runtime (it is shutting down), what it took stays.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let conn = conn.clone();
                runtime.spawn(async move {
                    let Ok((Ok(reply), cmd)) = tokio::time::timeout(LATE, call).await else {
                        return;
                    };
                    match undo {
                        Undo::One(late) => late.give_back(&conn, timeout, &cmd, &reply).await,
                        Undo::Batch(decisions) => {
                            crate::coalesce::give_back(decisions, &conn, timeout, reply).await
                        }
                    }
                });
            }
            Reply::TimedOut
        }
    }
}

/// One `EVALSHA` (reloading the script on `NOSCRIPT`) within `timeout`.
pub(crate) async fn send(conn: &Conn, timeout: Duration, script: &Lua, cmd: &Cmd) -> Reply {
    match tokio::time::timeout(timeout, conn.evalsha(script, cmd)).await {
        Ok(r) => Reply::Done(r),
        Err(_) => Reply::TimedOut,
    }
}

/// [`send`], answered by `deadline`.
pub(crate) async fn send_by(conn: &Conn, deadline: Instant, script: &Lua, cmd: &Cmd) -> Reply {
    match tokio::time::timeout_at(deadline, conn.evalsha(script, cmd)).await {
        Ok(r) => Reply::Done(r),
        Err(_) => Reply::TimedOut,
    }
}
