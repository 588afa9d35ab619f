//! Coalescing of concurrent `try` decisions: past `max_in_flight` calls on a
//! [`Scope`] they queue, and the next call to return sends up to `max_batch`
//! as one `lua/try_batch.lua` call.

use broker_core::LeaseId;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::call::{after, Reply, Takes, Undo};
use crate::health::Scope;
use crate::keys::KeyPair;
use crate::scripts;
use crate::RedisBackend;

type Lease = (KeyPair, LeaseId);

/// A queued decision's reply, with the lease it may have been granted, so
/// that whichever side finds the caller gone releases it.
type Answer = (Reply, Option<Lease>);

/// A decision waiting for its batch.
struct Pending {
    cmd: Cmd,
    lease: Option<Lease>,
    deadline: Instant,
    tx: oneshot::Sender<Answer>,
}

/// The queue and the calls in flight of one scope.
#[derive(Default)]
pub(crate) struct State {
    queue: Vec<Pending>,
    in_flight: usize,
}

impl State {
    /// The next batch of at most `max`, skipping decisions whose caller went away.
    fn take(&mut self, max: usize) -> Vec<Pending> {
        self.queue.retain(|p| !p.tx.is_closed());
        let n = self.queue.len().min(max);
        self.queue.drain(..n).collect()
    }
}

impl RedisBackend {
    /// Runs one `try` decision alone or in a batch; `lease`, if it may be
    /// granted one, is released if the caller goes away first.
    pub(crate) async fn coalesced(
        &self,
        cmd: Cmd,
        scope: Scope,
        lease: Option<Lease>,
        deadline: Instant,
    ) -> Reply {
        let set = &self.inner.set;
        let entered = {
            let mut queues = self.inner.queues.lock();
            let state = queues.entry(scope).or_default();
            let free = state.in_flight < set.max_in_flight && state.queue.is_empty();
            state.in_flight += usize::from(free);
            if free && !set.batch_every_call {
                Err((cmd, lease))
            } else {
                let (tx, rx) = oneshot::channel();
                let pending = Pending {
                    cmd,
                    lease,
                    deadline,
                    tx,
                };
                state.queue.push(pending);
                // With a place free, nothing in flight takes this queue: sent now.
                let batch = free.then(|| state.take(set.max_batch));
                drop(queues);
                if let Some(batch) = batch {
                    self.spawn_flush(scope, batch);
                }
                Ok(Queued(self, rx))
            }
        };
        let (cmd, lease) = match entered {
            Ok(mut queued) => {
                return match (&mut queued.1).await {
                    Ok((reply, _)) => reply,
                    Err(_) => Reply::Done(Err(RedisError::from((
                        ErrorKind::Client,
                        "the batch of this decision was dropped (runtime shutting down)",
                    )))),
                }
            }
            Err(lone) => lone,
        };
        let mut place = Alone(self, scope, false);
        let reply = self.send(&scripts::TRY, cmd, lease, Some(Takes::Try), deadline);
        let reply = reply.await;
        place.2 = matches!(reply, Reply::TimedOut);
        reply
    }

    /// The next batch of `scope` for the place of a call that returned, or
    /// `None` when the place is freed. After a timeout (`timed_out`) the
    /// whole queue is answered [`Reply::Unsent`].
    fn next_batch(&self, scope: Scope, timed_out: bool) -> Option<Vec<Pending>> {
        let mut queues = self.inner.queues.lock();
        let state = queues.entry(scope).or_default();
        let unsent = timed_out.then(|| std::mem::take(&mut state.queue));
        let batch = state.take(self.inner.set.max_batch);
        if batch.is_empty() {
            state.in_flight -= 1;
            if state.in_flight == 0 {
                queues.remove(&scope);
            }
        }
        drop(queues);
        for pending in unsent.into_iter().flatten() {
            self.answer(pending, Reply::Unsent);
        }
        (!batch.is_empty()).then_some(batch)
    }

    /// Sends `batch`, then the scope's next batches until its queue is
    /// empty, from a task that holds one place in flight throughout.
    fn spawn_flush(&self, scope: Scope, batch: Vec<Pending>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Shutting down: the callers learn so from their dropped senders.
            drop(batch);
            while self.next_batch(scope, false).is_some() {}
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            let mut batch = Some(batch);
            while let Some(b) = batch {
                let timed_out = this.flush(b).await;
                batch = this.next_batch(scope, timed_out);
            }
        });
    }

    /// Sends one batch (its keys share the scope's slot) as one call, and
    /// answers each caller. Whether it got no reply in time.
    async fn flush(&self, mut batch: Vec<Pending>) -> bool {
        let cmd = batch_cmd(&batch);
        let deadline = batch.iter().map(|p| p.deadline).min();
        let deadline = deadline.unwrap_or_else(|| after(self.inner.set.response_timeout));
        // Each decision's own call, to give back what it took if the reply
        // comes late.
        let late = batch
            .iter_mut()
            .map(|p| (std::mem::take(&mut p.cmd), p.lease.as_ref().map(|l| l.1)))
            .collect();
        let undo = Some(Undo::Batch(late));
        let replies = match self.eval(deadline, &scripts::TRY_BATCH, cmd, undo).await {
            Reply::Done(Ok(Value::Array(items))) if items.len() == batch.len() => items
                .into_iter()
                .map(|item| Reply::Done(decision_reply(item)))
                .collect(),
            Reply::Done(Ok(_)) => {
                let e = RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "the batch script replied with the wrong number of replies",
                ));
                vec![Reply::Done(Err(e)); batch.len()]
            }
            other => vec![other; batch.len()],
        };
        let timed_out = replies.iter().any(|r| matches!(r, Reply::TimedOut));
        for (pending, reply) in batch.into_iter().zip(replies) {
            self.answer(pending, reply);
        }
        timed_out
    }

    /// Hands `reply` to the caller of `pending`. Its lease is released when
    /// the outcome is unknown, or when the caller went away and it was
    /// granted.
    fn answer(&self, pending: Pending, reply: Reply) {
        let Pending { tx, mut lease, .. } = pending;
        if let Some(lease) = lease.take_if(|_| reply.unknown()) {
            self.release_later(lease);
        }
        if let Err((reply, Some(lease))) = tx.send((reply, lease)) {
            if reply.granted() {
                self.release_later(lease);
            }
        }
    }
}

/// A queued decision's side of its channel: dropped before its reply was
/// read, it releases the lease the reply granted.
struct Queued<'a>(&'a RedisBackend, oneshot::Receiver<Answer>);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        // Closed first: a reply not sent yet is refused, and released by
        // `answer`; one already sent is here.
        self.1.close();
        if let Ok((reply, Some(lease))) = self.1.try_recv() {
            if reply.granted() {
                self.0.release_later(lease);
            }
        }
    }
}

/// A lone decision's place in flight on its scope, and whether its call
/// timed out: dropped, it hands the scope's queue on or frees the place.
struct Alone<'a>(&'a RedisBackend, Scope, bool);

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        if let Some(batch) = self.0.next_batch(self.1, self.2) {
            self.0.spawn_flush(self.1, batch);
        }
    }
}

/// One decision's reply in a batch's: `{0, text}` is the error its script
/// raised, turned back into that error.
pub(crate) fn decision_reply(item: Value) -> RedisResult<Value> {
    let Value::Array(v) = &item else {
        return Ok(item);
    };
    let [Value::Int(0), Value::BulkString(text)] = v.as_slice() else {
        return Ok(item);
    };
    let raw = [b"-", text.as_slice(), b"\r\n"].concat();
    redis::parse_redis_value(&raw)?.extract_error()?;
    let e = "a script error that does not read as one";
    Err(RedisError::from((ErrorKind::UnexpectedReturnType, e)))
}

/// `EVALSHA batch 2k keys... k (m argv...)...` from the decisions' own
/// `EVALSHA sha 2 buckets leases argv...`.
fn batch_cmd(batch: &[Pending]) -> Cmd {
    let args: Vec<Vec<&[u8]>> = batch.iter().map(|p| scripts::args_of(&p.cmd)).collect();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(scripts::TRY_BATCH.compiled.get_hash())
        .arg(2 * batch.len());
    for a in &args {
        cmd.arg(a[3]).arg(a[4]);
    }
    cmd.arg(batch.len());
    for a in &args {
        cmd.arg(a.len() - 5).arg(&a[5..]);
    }
    cmd
}
