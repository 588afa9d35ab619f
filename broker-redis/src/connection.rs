//! The connection to Redis (one server: the `redis` crate's reconnecting
//! [`ConnectionManager`]; or its cluster client) and `EVALSHA` with a
//! reload on `NOSCRIPT`.

use std::sync::Arc;
use std::time::Duration;

use broker_core::BackendError;

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::scripts::Lua;

/// A cheap-to-clone handle on the store.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server, through a connection manager that reconnects by itself.
    Single(ConnectionManager),
    /// A Redis Cluster.
    #[cfg(feature = "cluster")]
    /// With the time in ms a `settle` is kept from running twice (see
    /// [`once_ms`]).
    Cluster(redis::cluster_async::ClusterConnection, u64),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Single(_) => f.write_str("Conn::Single"),
            #[cfg(feature = "cluster")]
            Conn::Cluster(..) => f.write_str("Conn::Cluster"),
        }
    }
}

/// Timeouts that keep a dead or black-holed server from hanging callers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// For opening a connection (see the builder's `connect_timeout`).
    pub(crate) connect: Duration,
    /// The bound on how long any call waits, a connection it waits for
    /// included (see the builder's `response_timeout`).
    pub(crate) response: Duration,
}

impl Conn {
    /// Connects to one server.
    pub(crate) async fn single(url: &str, t: Timeouts) -> RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let manager = ConnectionManager::new_with_config(client, manager_config(t)).await?;
        Ok(Conn::Single(manager))
    }

    /// One server, connected by the first command (and again after any
    /// failed attempt): only the URL is checked now.
    pub(crate) fn single_lazy(url: &str, t: Timeouts) -> RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let manager = ConnectionManager::new_lazy_with_config(client, manager_config(t))?;
        Ok(Conn::Single(manager))
    }

    /// Connects to a cluster through any of its nodes.
    #[cfg(feature = "cluster")]
    pub(crate) async fn cluster(urls: &[String], t: Timeouts) -> RedisResult<Self> {
        let client = redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(t.connect)
            .response_timeout(cluster_response(t))
            .retries(1)
            .min_retry_wait(10)
            .max_retry_wait(100)
            .build()?;
        let once = once_ms(t);
        Ok(Conn::Cluster(client.get_async_connection().await?, once))
    }

    /// Sends one command; a timeout error after `timeout`.
    pub(crate) async fn query(&self, cmd: &Cmd, timeout: Duration) -> RedisResult<Value> {
        match tokio::time::timeout(timeout, self.query_resending(cmd, true)).await {
            Ok(reply) => reply,
            Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        }
    }

    /// [`Conn::query`]; `resend`: whether the manager may send the
    /// command again after a broken pipe (see [`managed`]).
    async fn query_resending(&self, cmd: &Cmd, resend: bool) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => managed(c, cmd, resend).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Whether the store answers a `PING` within `timeout`, the probe of a
    /// server that is down.
    pub(crate) async fn ping(&self, timeout: Duration) -> bool {
        let ping = async {
            match self {
                Conn::Single(c) => managed(c, &redis::cmd("PING"), true).await,
                #[cfg(feature = "cluster")]
                Conn::Cluster(c, _) => redis::cmd("PING").query_async(&mut c.clone()).await,
            }
        };
        matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_)))
    }

    /// Whether the primary of `slot` answers a `PING` within `timeout`
    /// (on one server: the server), the probe of a slot that is down.
    #[cfg(feature = "cluster")]
    pub(crate) async fn ping_slot(
        &self,
        slot: redis::cluster_routing::Slot,
        timeout: Duration,
    ) -> bool {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let c = match self {
            Conn::Single(_) => return self.ping(timeout).await,
            Conn::Cluster(c, _) => c,
        };
        let node = Route::with_slot(slot, SlotAddr::Master);
        let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node));
        let mut c = c.clone();
        let ping = c.route_command(redis::cmd("PING"), node);
        matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_)))
    }

    /// Loads `script` where `cmd`, a call of it, runs: the server, or on
    /// a cluster the node of `cmd`'s key (see [`load_on_node`]).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    async fn load(&self, script: &Lua, cmd: &Cmd) -> RedisResult<String> {
        match self {
            Conn::Single(c) => script.load_async(&mut c.clone()).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => load_on_node(c, script, cmd).await,
        }
    }

    /// Runs an `EVALSHA` built for `script`: one round trip, plus a
    /// `SCRIPT LOAD` and a second try only when the server answers
    /// `NOSCRIPT` (a new or restarted server, or `SCRIPT FLUSH`).
    pub(crate) async fn evalsha(&self, script: &Lua, cmd: &Cmd) -> RedisResult<Value> {
        let resend = resendable(script);
        // A cluster's client sends a command again on its own (see
        // `scripts::run_once`): one that must not run twice gets a key
        // that makes a second run change nothing.
        #[cfg(feature = "cluster")]
        let once = match (self, resend) {
            (Conn::Cluster(_, ms), false) => crate::scripts::run_once(cmd, rand::random(), *ms),
            _ => None,
        };
        #[cfg(feature = "cluster")]
        let cmd = once.as_ref().unwrap_or(cmd);
        match self.query_resending(cmd, resend).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // Boxed: a cluster's routed `SCRIPT LOAD` is a large future,
                // which would grow every call's (boxed per decision, see
                // `send::send_or_later`) past the sizes malloc serves
                // from its per-thread cache, for a path a server takes once
                // per script.
                Box::pin(self.load(script, cmd)).await?;
                self.query_resending(cmd, resend).await
            }
            other => other,
        }
    }
}

/// Loads `script` on the primary of the slot of `cmd`'s first key (`cmd`
/// an `EVALSHA` of it, which the client sends there), the node that
/// answered `NOSCRIPT`: a `SCRIPT LOAD` the client sends itself goes to
/// every primary and waits for all of them, so one frozen or dead node
/// would make the call fail on a healthy one. (A call without a key is
/// loaded on every primary.)
#[cfg(feature = "cluster")]
async fn load_on_node(
    c: &redis::cluster_async::ClusterConnection,
    script: &Lua,
    cmd: &Cmd,
) -> RedisResult<String> {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    // EVALSHA sha numkeys key ...
    let key = match cmd.args_iter().nth(3) {
        Some(redis::Arg::Simple(key)) => key,
        _ => return script.load_async(&mut c.clone()).await,
    };
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(script.source);
    let node = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
    let sha = c
        .clone()
        .route_command(load, RoutingInfo::SingleNode(node))
        .await?;
    Ok(redis::from_redis_value(sha)?)
}

/// The cluster client's own reply timeout, as the connection manager's
/// (see [`manager_config`]): past the response timeout and the wait for
/// a late reply ([`crate::send::LATE`]), so that a decision with no
/// reply within the response timeout still reads its reply, to give back
/// what it took (the client's own timeout would drop the reply, and with
/// its retry could even send the decision again).
#[cfg(feature = "cluster")]
fn cluster_response(t: Timeouts) -> Duration {
    t.response.saturating_add(crate::send::LATE)
}

/// How long (ms) a `settle` sent over a cluster connection keeps its own
/// key (see `scripts::run_once`): past every time the cluster's client
/// may send it again, twice over, and at least 10 s; at most a day (a
/// timeout of `Duration::MAX` means none). A settle waits for its reply
/// for the response timeout (it is sent by `send::send`, which reads
/// no late reply), and the client sends a request again only while its
/// caller waits (a dropped caller's request is not retried), so the
/// client's longer reply timeout (see [`cluster_response`]) does not
/// lengthen the window.
#[cfg(feature = "cluster")]
fn once_ms(t: Timeouts) -> u64 {
    let ms = u64::try_from(t.response.as_millis()).unwrap_or(u64::MAX);
    ms.saturating_mul(4)
        .saturating_add(1_000)
        .clamp(10_000, 86_400_000)
}

/// Whether a call of `script` may be sent again after a broken pipe on
/// the shared connection, which may have run it (see [`managed`]): every
/// transition but `settle` leaves the same state when run twice in a row
/// (a second `try` or `book` only takes more, conservatively; a lease
/// is added or removed once, and a second run that finds its own lease held
/// answers as the first did, see `held` in `lua/lib.lua`), while a second
/// `settle` refunds or charges again. (A cluster's client sends commands
/// again on its own; there a `settle` is made to run once instead, see
/// `scripts::run_once`.)
fn resendable(script: &Lua) -> bool {
    // The scripts are statics: one address each (no hash compared per call).
    !std::ptr::eq(script, &crate::scripts::SETTLE)
}

/// `cmd` through the manager, sent again once (when `resend`) if the
/// connection failed under it with a broken pipe, which the manager
/// reconnects for the second try. That is what a connection closed while
/// idle (a server's or a proxy's idle timeout) gives the next command,
/// never written; but a connection closed while a command waits for its
/// reply gives the same error, and that command may have run. So a
/// command that must not run twice is not sent again: its caller gets an
/// error of its own, not an outage (the connection is replaced for the
/// next call, and a server that is really gone is found by that call), so
/// a closed idle connection does not make the failure policy answer the
/// other calls.
async fn managed(c: &ConnectionManager, cmd: &Cmd, resend: bool) -> RedisResult<Value> {
    match cmd.query_async(&mut c.clone()).await {
        Err(e) if is_broken_pipe(&e) => match resend {
            true => cmd.query_async(&mut c.clone()).await,
            false => Err(RedisError::from((
                ErrorKind::Client,
                "the connection closed before the reply; not sent again (it may have run)",
                e.to_string(),
            ))),
        },
        other => other,
    }
}

/// Whether `e` is a write on a connection the other side had closed.
fn is_broken_pipe(e: &RedisError) -> bool {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let Some(source) = std::error::Error::source(e) else {
        return false;
    };
    let io = match source.downcast_ref::<Shared>() {
        Some(shared) => shared.downcast_ref::<std::io::Error>(),
        None => source.downcast_ref::<std::io::Error>(),
    };
    io.is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The connection manager's settings: the timeouts, one quick retry. Its
/// own reply timeout is past the response timeout and the wait for a late
/// reply ([`crate::send::LATE`]): every call is bounded by the
/// response timeout of its own, and a decision with no reply by then
/// still reads its reply, to give back what it took (the manager's own
/// timeout would drop it, and the cost with it).
fn manager_config(t: Timeouts) -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t.connect))
        .set_response_timeout(Some(t.response.saturating_add(crate::send::LATE)))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
}

/// A Redis error as a [`BackendError`].
pub(crate) fn redis_error(e: RedisError) -> BackendError {
    BackendError::new(format!("redis: {e}"))
}

/// Whether `e` means the store cannot be reached or cannot serve now (the
/// failure policy answers), as opposed to a bad command or script.
pub(crate) fn is_unavailable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
            ) | ErrorKind::ClusterConnectionNotFound
        )
        // Writes refused: out of memory, a failed background save
        // (`stop-writes-on-bgsave-error`), too few replicas
        // (`min-replicas-to-write`); or every command refused while a
        // script runs past `busy-reply-threshold` (`BUSY`).
        || matches!(e.code(), Some("OOM" | "MISCONF" | "NOREPLICAS" | "BUSY"))
}

/// Whether Redis itself answered `e` (an error reply, or a reply of a
/// shape the script does not give): proof that it is up. An error the
/// client made without an answer (a batch dropped while the runtime shuts
/// down) says nothing of it.
pub(crate) fn answered_by_redis(e: &RedisError) -> bool {
    e.code().is_some()
        || matches!(
            e.kind(),
            ErrorKind::Server(_)
                | ErrorKind::UnexpectedReturnType
                | ErrorKind::Parse
                | ErrorKind::AuthenticationFailed
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A settle's own key outlasts the cluster client's resends: 4× the
    /// response timeout (the bound on one call) plus a second, within 10 s
    /// and a day.
    #[cfg(feature = "cluster")]
    #[test]
    fn a_settles_own_key_outlasts_every_resend() {
        let t = |connect, response| Timeouts {
            connect: Duration::from_millis(connect),
            response: Duration::from_millis(response),
        };
        assert_eq!(once_ms(t(100, 500)), 10_000);
        assert_eq!(once_ms(t(1_000, 30_000)), 121_000);
        let unbounded = Timeouts {
            response: Duration::MAX,
            ..t(0, 0)
        };
        assert_eq!(once_ms(unbounded), 86_400_000);
    }

    #[test]
    fn only_an_error_redis_answered_proves_it_up() {
        let dropped = RedisError::from((
            ErrorKind::Client,
            "the batch of this decision was dropped (runtime shutting down)",
        ));
        assert!(!answered_by_redis(&dropped));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(!answered_by_redis(&io));
        let shape = RedisError::from((ErrorKind::UnexpectedReturnType, "wrong shape"));
        assert!(answered_by_redis(&shape));
    }
}
