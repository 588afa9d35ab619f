//! Coalescing of concurrent `try` decisions: while a decision is in flight
//! on a backend, the next ones queue, and go out together as one `EVALSHA`
//! of the batch script (`lua/try_batch.lua`) when a call in flight returns.
//!
//! - A lone decision is sent at once, by its caller, with its own script
//!   (no timer, no task in between): exactly the uncoalesced call.
//! - At most `max_in_flight` calls are in flight per [`Scope`] (the
//!   server; on a cluster, a hash slot, whose keys alone a call may hold);
//!   a decision that finds them all busy joins its scope's queue. The call that returns first takes the queue
//!   (at most `max_batch` decisions) and sends it from a task, which goes
//!   on with the next queued decisions until the queue is empty. The batch
//!   size thus follows the load by itself.
//! - Every decision is applied in order, each as its own script would apply
//!   it; every caller still waits for one round trip (plus the one in
//!   flight when it queued).
//! - A caller that goes away before its decision is sent is skipped; one
//!   that goes away after it was sent has its lease, if it was granted one,
//!   released (`release` is idempotent), so no slot leaks.
//! - A call in flight that gets no reply within the timeout does not hand
//!   on the queued decisions of its scope: they are answered at once by the
//!   failure policy, as new calls there are then, instead of each batch
//!   waiting out a timeout of its own. On a cluster the other slots have
//!   places and queues of their own, so a frozen node holds up no decision
//!   on another (a batch could not mix slots anyway: all keys of a call
//!   must be in one).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use broker_core::LeaseId;
use redis::{Arg, Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::connection::Conn;
use crate::health::Scope;
use crate::keys::KeyPair;
use crate::scripts::{self, Lua};
use crate::send::{granted, release_later, send_or_later, Late, Reply, Takes, Undo, Unsettled};

/// The limits of the coalescing, and whether it is on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Off: one script call per decision.
    pub(crate) enabled: bool,
    /// Most decisions in one batch.
    pub(crate) max_batch: usize,
    /// Most calls in flight at once before decisions queue.
    pub(crate) max_in_flight: usize,
    /// Sends every decision, even a lone one, through the batch script
    /// (tests use it to run the conformance suite on that script).
    pub(crate) batch_every_call: bool,
    /// Splits a batch by hash tag (Redis Cluster).
    pub(crate) group_by_tag: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_batch: 32,
            max_in_flight: 5,
            batch_every_call: false,
            group_by_tag: false,
        }
    }
}

/// Where [`Coalescer::enter`] put a decision.
enum Entered {
    /// In flight alone: its caller sends it.
    Alone(Cmd, Option<(KeyPair, LeaseId)>),
    /// Queued: the answer comes through the channel.
    Queued(oneshot::Receiver<Answer>),
}

/// A queued decision's reply, and the lease it may have been granted: the
/// lease goes with the reply, so that whichever side finds the caller gone
/// (the batch, or the caller's side of the channel, see [`Queued`])
/// releases it.
type Answer = (Reply, Option<(KeyPair, LeaseId)>);

/// A decision waiting for its batch.
struct Pending {
    script: &'static Lua,
    cmd: Cmd,
    lease: Option<(KeyPair, LeaseId)>,
    /// When its caller is answered at the latest (see [`Coalescer::run`]).
    deadline: Instant,
    tx: oneshot::Sender<Answer>,
}

/// The queue and the calls in flight of one scope.
#[derive(Default)]
struct State {
    queue: Vec<Pending>,
    in_flight: usize,
}

/// The [`State`] of every scope: the server's, and on a cluster one per
/// hash slot with a call in flight (dropped once idle, so at most one per
/// slot in use).
#[derive(Default)]
struct States {
    whole: State,
    #[cfg(feature = "cluster")]
    slots: std::collections::HashMap<redis::cluster_routing::Slot, State>,
}

impl States {
    /// The state of `scope`, made for a slot that has none.
    fn of(&mut self, scope: Scope) -> &mut State {
        match scope {
            Scope::Whole => &mut self.whole,
            #[cfg(feature = "cluster")]
            Scope::Slot(slot) => self.slots.entry(slot).or_default(),
        }
    }

    /// Frees `scope`'s call in flight: drops a slot's state once it has
    /// no call in flight and no queue.
    fn free_place(&mut self, scope: Scope) {
        let state = self.of(scope);
        state.in_flight -= 1;
        #[cfg(feature = "cluster")]
        if let Scope::Slot(slot) = scope {
            if state.in_flight == 0 && state.queue.is_empty() {
                self.slots.remove(&slot);
            }
        }
    }
}

/// The coalescer of one backend.
pub(crate) struct Coalescer {
    conn: Conn,
    response_timeout: Duration,
    settings: Settings,
    /// Whether the cost of a decision granted after its caller was told it
    /// timed out is given back (see [`Late`]).
    refund_late: bool,
    states: Mutex<States>,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Coalescer {
    pub(crate) fn new(
        conn: Conn,
        response_timeout: Duration,
        settings: Settings,
        refund_late: bool,
    ) -> Self {
        Self {
            conn,
            response_timeout,
            refund_late,
            settings: Settings {
                max_batch: settings.max_batch.max(1),
                max_in_flight: settings.max_in_flight.max(1),
                ..settings
            },
            states: Mutex::new(States::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, States> {
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one `try` decision (`cmd`, of `script`, on `scope`), alone or in
    /// a batch (answered by its earliest `deadline`); `lease`, if it may be
    /// granted one, is released if the caller goes away first.
    pub(crate) async fn run(
        self: &Arc<Self>,
        script: &'static Lua,
        cmd: Cmd,
        scope: Scope,
        lease: Option<(KeyPair, LeaseId)>,
        deadline: Instant,
    ) -> Reply {
        let mut queued = match self.enter(script, cmd, scope, lease, deadline) {
            Entered::Alone(cmd, lease) => {
                return self.run_alone(script, cmd, scope, lease, deadline).await
            }
            Entered::Queued(rx) => Queued {
                coalescer: self,
                rx,
            },
        };
        match (&mut queued.rx).await {
            Ok((reply, _lease)) => reply,
            Err(_) => Reply::Done(Err(RedisError::from((
                ErrorKind::Client,
                "the batch of this decision was dropped (runtime shutting down)",
            )))),
        }
    }

    /// Takes a place in flight of `scope` for a lone decision, or queues
    /// it.
    fn enter(
        self: &Arc<Self>,
        script: &'static Lua,
        cmd: Cmd,
        scope: Scope,
        lease: Option<(KeyPair, LeaseId)>,
        deadline: Instant,
    ) -> Entered {
        let mut states = self.lock();
        let state = states.of(scope);
        let free = state.in_flight < self.settings.max_in_flight && state.queue.is_empty();
        if free && !self.settings.batch_every_call {
            state.in_flight += 1;
            return Entered::Alone(cmd, lease);
        }
        let (tx, rx) = oneshot::channel();
        state.queue.push(Pending {
            script,
            cmd,
            lease,
            deadline,
            tx,
        });
        if free {
            // Only with `batch_every_call`: nothing is in flight to take
            // the queue when it returns, so send it now.
            state.in_flight += 1;
            let batch = self.take(state);
            drop(states);
            self.spawn_flush(scope, batch);
        }
        Entered::Queued(rx)
    }

    /// A decision sent by its caller, as one call of its own script.
    async fn run_alone(
        self: &Arc<Self>,
        script: &'static Lua,
        cmd: Cmd,
        scope: Scope,
        lease: Option<(KeyPair, LeaseId)>,
        deadline: Instant,
    ) -> Reply {
        let mut place = Alone {
            coalescer: self,
            scope,
            timed_out: false,
        };
        let late = Undo::One(self.late(lease.as_ref()));
        // Declared after the place, so dropped first: a lease is released
        // before the place is handed on.
        let unsettled = Unsettled::new(&self.conn, self.response_timeout, lease);
        let timeout = self.response_timeout;
        let reply = send_or_later(&self.conn, deadline, timeout, script, cmd, late).await;
        // The lease of a decision whose outcome is unknown (no reply in
        // time, a failed connection) is released as its caller's would be:
        // the caller is told the call failed, and never holds it.
        unsettled.settle(&reply);
        place.timed_out = matches!(reply, Reply::TimedOut);
        reply
    }

    /// What to give back of a `try` decision (which may be granted
    /// `lease`) granted after its caller was told it timed out.
    fn late(&self, lease: Option<&(KeyPair, LeaseId)>) -> Late {
        Late {
            takes: Takes::Try,
            lease: lease.map(|l| l.1),
            refund: self.refund_late,
        }
    }

    /// Takes the next batch off the queue, skipping decisions whose caller
    /// went away.
    fn take(&self, state: &mut State) -> Vec<Pending> {
        state.queue.retain(|p| !p.tx.is_closed());
        let n = state.queue.len().min(self.settings.max_batch);
        state.queue.drain(..n).collect()
    }

    /// A call in flight on `scope` returned (`timed_out`: with no reply in
    /// time): hands the scope's queue to a flush task, or frees its place.
    fn returned(self: &Arc<Self>, scope: Scope, timed_out: bool) {
        if let Some(batch) = self.next(scope, timed_out) {
            self.spawn_flush(scope, batch);
        }
    }

    /// The next batch of `scope` for the place in flight of a call that
    /// returned, or `None` when its place is freed: the queue is empty, or
    /// the call got no reply in time (`timed_out`), and every decision
    /// queued on the scope is answered [`Reply::Unsent`] at once (each
    /// would otherwise wait out a timeout of its own, a batch at a time).
    fn next(&self, scope: Scope, timed_out: bool) -> Option<Vec<Pending>> {
        let mut states = self.lock();
        let state = states.of(scope);
        let unsent = match timed_out {
            true => std::mem::take(&mut state.queue),
            false => Vec::new(),
        };
        let batch = self.take(state);
        if batch.is_empty() {
            states.free_place(scope);
        }
        drop(states);
        for pending in unsent {
            self.answer(pending, Reply::Unsent);
        }
        (!batch.is_empty()).then_some(batch)
    }

    /// Sends `batch` of `scope`, then the scope's next queued decisions,
    /// until its queue is empty; holds one of its places in flight
    /// throughout.
    fn spawn_flush(self: &Arc<Self>, scope: Scope, batch: Vec<Pending>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (it is shutting down): the callers are told so by
            // their dropped senders.
            self.lock().free_place(scope);
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            let mut batch = batch;
            loop {
                let timed_out = this.flush(batch).await;
                match this.next(scope, timed_out) {
                    Some(next) => batch = next,
                    None => return,
                }
            }
        });
    }

    /// Sends one batch and answers each of its callers: as one call, or on
    /// a cluster as one call per hash tag (all keys of a call must be in
    /// one slot), all at once. Whether any call got no reply in time.
    async fn flush(&self, batch: Vec<Pending>) -> bool {
        if !self.settings.group_by_tag {
            return self.flush_group(batch).await;
        }
        let mut groups: Vec<(Vec<u8>, Vec<Pending>)> = Vec::new();
        for p in batch {
            let tag = hash_tag(&p.cmd);
            match groups.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, group)) => group.push(p),
                None => groups.push((tag, vec![p])),
            }
        }
        let sent = groups.into_iter().map(|(_, g)| self.flush_group(g));
        futures::future::join_all(sent).await.into_iter().any(|o| o)
    }

    /// Sends decisions whose keys share a slot as one call. Whether it got
    /// no reply in time.
    async fn flush_group(&self, mut batch: Vec<Pending>) -> bool {
        if batch.len() == 1 && !self.settings.batch_every_call {
            if let Some(mut one) = batch.pop() {
                let cmd = std::mem::take(&mut one.cmd);
                let late = Undo::One(self.late(one.lease.as_ref()));
                let (deadline, timeout) = (one.deadline, self.response_timeout);
                let reply =
                    send_or_later(&self.conn, deadline, timeout, one.script, cmd, late).await;
                let timed_out = matches!(reply, Reply::TimedOut);
                self.answer(one, reply);
                return timed_out;
            }
        }
        let cmd = batch_cmd(&batch);
        let deadline = batch.iter().map(|p| p.deadline).min();
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.response_timeout);
        // Each decision's own call, to give back what it took if the
        // batch's reply comes late.
        let late = batch
            .iter_mut()
            .map(|p| (std::mem::take(&mut p.cmd), self.late(p.lease.as_ref())))
            .collect();
        let sent = send_or_later(
            &self.conn,
            deadline,
            self.response_timeout,
            &scripts::TRY_BATCH,
            cmd,
            Undo::Batch(late),
        );
        let replies = match sent.await {
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

    /// Hands `reply` to the caller of `pending`; if it went away and the
    /// decision was allowed with a lease, or the outcome is unknown (the
    /// caller is told the call failed, and the script may still grant the
    /// lease), releases the lease. A caller that goes away after this,
    /// with the reply unread, has its lease released by [`Queued`].
    fn answer(&self, pending: Pending, reply: Reply) {
        let Pending { tx, mut lease, .. } = pending;
        if reply.unknown() {
            if let Some(lease) = lease.take() {
                self.release_later(lease);
            }
        }
        if let Err((reply, Some(lease))) = tx.send((reply, lease)) {
            if granted(&reply) {
                self.release_later(lease);
            }
        }
    }

    /// Releases a lease whose holder went away, from a task of its own.
    fn release_later(&self, lease: (KeyPair, LeaseId)) {
        release_later(&self.conn, self.response_timeout, lease);
    }
}

/// A queued decision's side of its channel. Dropped before its reply was
/// read (its caller went away), it releases the lease the reply granted:
/// the batch sees a caller gone only before it sends the reply, and one
/// that goes away after (its task woken by the reply, and dropped before
/// it ran) would keep the slot taken until the lease's TTL.
struct Queued<'a> {
    coalescer: &'a Coalescer,
    rx: oneshot::Receiver<Answer>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        // Closed first: a reply not sent yet is refused, and released by
        // the batch (`answer`); one already sent is here.
        self.rx.close();
        if let Ok((reply, Some(lease))) = self.rx.try_recv() {
            if granted(&reply) {
                self.coalescer.release_later(lease);
            }
        }
    }
}

/// A lone decision's place in flight. When dropped (answered, or its
/// caller gone), it frees the place or hands the queue on.
struct Alone<'a> {
    coalescer: &'a Arc<Coalescer>,
    /// The scope whose place it holds.
    scope: Scope,
    /// Whether it got no reply in time.
    timed_out: bool,
}

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        self.coalescer.returned(self.scope, self.timed_out);
    }
}

/// The hash tag (`{...}`) of a decision's bucket key, the first key of its
/// `EVALSHA`.
fn hash_tag(cmd: &Cmd) -> Vec<u8> {
    let key = match cmd.args_iter().nth(3) {
        Some(Arg::Simple(key)) => key,
        _ => return Vec::new(),
    };
    match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open..].iter().position(|&b| b == b'}') {
            Some(len) => key[open..open + len + 1].to_vec(),
            None => key.to_vec(),
        },
        None => key.to_vec(),
    }
}

/// One decision's reply in a batch's: its script's reply, or `{0, text}`
/// for the error it raised, turned back into that error.
fn decision_reply(item: Value) -> RedisResult<Value> {
    let text = match &item {
        Value::Array(v) if matches!(v.first(), Some(Value::Int(0))) => match v.get(1) {
            Some(Value::BulkString(b)) => b,
            _ => return Ok(item),
        },
        _ => return Ok(item),
    };
    let mut raw = Vec::with_capacity(text.len() + 3);
    raw.push(b'-');
    raw.extend_from_slice(text);
    raw.extend_from_slice(b"\r\n");
    match redis::parse_redis_value(&raw) {
        Ok(Value::ServerError(e)) => Err(e.into()),
        Ok(v) => v.extract_error().and(Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "a script error that does not read as one",
        )))),
        Err(e) => Err(e),
    }
}

/// `EVALSHA batch 2k keys... k (m args...)...` from the decisions' own
/// `EVALSHA sha 2 bucket lease args...` commands.
fn batch_cmd(batch: &[Pending]) -> Cmd {
    let (mut arg_count, mut bytes) = (4, 64);
    for p in batch {
        arg_count += p.cmd.args_iter().len();
        bytes += p
            .cmd
            .args_iter()
            .map(|a| match a {
                Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum::<usize>();
    }
    let mut cmd = Cmd::with_capacity(arg_count, bytes);
    cmd.arg("EVALSHA");
    cmd.arg(scripts::TRY_BATCH.get_hash()).arg(2 * batch.len());
    // Each command's arguments after EVALSHA: sha, 2, the two keys, ARGV.
    fn args(p: &Pending) -> impl ExactSizeIterator<Item = &[u8]> {
        p.cmd.args_iter().skip(1).map(|a| match a {
            Arg::Simple(b) => b,
            _ => &[][..],
        })
    }
    for p in batch {
        for key in args(p).skip(2).take(2) {
            cmd.arg(key);
        }
    }
    cmd.arg(batch.len());
    for p in batch {
        let argv = args(p).skip(4);
        cmd.arg(argv.len());
        for a in argv {
            cmd.arg(a);
        }
    }
    cmd
}

/// Gives back what each decision of a batch took, from the batch's late
/// `reply` (see [`Undo`]): `decisions` are their own calls, in order.
pub(crate) async fn give_back(
    decisions: Vec<(Cmd, Late)>,
    conn: &Conn,
    timeout: Duration,
    reply: Value,
) {
    let Value::Array(items) = reply else { return };
    if items.len() != decisions.len() {
        return;
    }
    for (item, (cmd, late)) in items.into_iter().zip(decisions) {
        if let Ok(reply) = decision_reply(item) {
            late.give_back(conn, timeout, &cmd, &reply).await;
        }
    }
}
