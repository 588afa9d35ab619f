//! The connection to Redis (one server through the `redis` crate's
//! reconnecting [`ConnectionManager`], or its cluster client) and
//! `EVALSHA` with a reload on `NOSCRIPT`.

use std::sync::Arc;
use std::time::Duration;

use broker_core::BackendError;

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, Value};

use crate::builder::{redacted, RedisBackendBuilder};
use crate::health::Scope;
use crate::scripts::Lua;

/// A cheap-to-clone handle on the store.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    /// With how long (ms) a `settle` keeps its own key (see [`once_ms`]).
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection, u64),
}

impl Conn {
    /// Connects to the one server or the cluster `b` gives; a lazy
    /// connection (one server only) is opened by the first command.
    pub(crate) async fn open(b: &RedisBackendBuilder) -> Result<Self, BackendError> {
        let url = b
            .urls
            .first()
            .ok_or_else(|| BackendError::new("no redis url given"))?;
        // The client's own reply timeout is past the response timeout and
        // [`LATE`](crate::call::LATE): a decision with no reply in time still
        // reads its late reply, to give back what it took.
        let response = b.response_timeout.saturating_add(crate::call::LATE);
        // `cluster` is set only by `cluster()`, under the feature.
        match (b.cluster, b.lazy) {
            #[cfg(feature = "cluster")]
            (true, false) => async {
                let client =
                    redis::cluster::ClusterClient::builder(b.urls.iter().map(String::as_str))
                        .connection_timeout(b.connect_timeout)
                        .response_timeout(response)
                        .retries(1)
                        .min_retry_wait(10)
                        .max_retry_wait(100)
                        .build()?;
                let once = once_ms(b.response_timeout);
                RedisResult::Ok(Conn::Cluster(client.get_async_connection().await?, once))
            }
            .await
            .map_err(|e| BackendError::new(format!("connecting to redis cluster: {e}"))),
            (true, _) => Err(BackendError::new(
                "lazy_connect applies to one server, not to a cluster",
            )),
            (false, lazy) => async {
                let client = redis::Client::open(url.as_str())?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(b.connect_timeout))
                    .set_response_timeout(Some(response))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(100));
                Ok(Conn::Single(match lazy {
                    true => ConnectionManager::new_lazy_with_config(client, config)?,
                    false => ConnectionManager::new_with_config(client, config).await?,
                }))
            }
            .await
            .map_err(|e: RedisError| {
                BackendError::new(format!("connecting to redis url {:?}: {e}", redacted(url)))
            }),
        }
    }

    /// Sends one command; a timeout error after `timeout`.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        timeout: Duration,
    ) -> RedisResult<T> {
        match tokio::time::timeout(timeout, self.send(cmd, true)).await {
            Ok(reply) => Ok(redis::from_redis_value(reply?)?),
            Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        }
    }

    /// `cmd`; `resend`: whether it may be sent again after a broken pipe
    /// (see [`managed`]).
    async fn send(&self, cmd: &Cmd, resend: bool) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => managed(c, cmd, resend).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// `cmd` to `scope`: on a cluster, its slot's primary.
    pub(crate) async fn send_to(&self, scope: Scope, cmd: Cmd) -> RedisResult<Value> {
        #[cfg(feature = "cluster")]
        if let (Conn::Cluster(c, _), Scope::Slot(slot)) = (self, scope) {
            use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
            let node =
                SingleNodeRoutingInfo::SpecificNode(Route::with_slot(slot, SlotAddr::Master));
            return c
                .clone()
                .route_command(cmd, RoutingInfo::SingleNode(node))
                .await;
        }
        let _ = scope;
        self.send(&cmd, true).await
    }

    /// Runs `cmd`, an `EVALSHA` of `script`, loading the script and trying
    /// again once when the server answers `NOSCRIPT`.
    pub(crate) async fn evalsha(&self, script: &Lua, cmd: &Cmd) -> RedisResult<Value> {
        // Every transition but `settle` leaves the same state when run twice
        // (a second `try` or `book` only takes more; see `held` in lib.lua).
        let resend = !std::ptr::eq(script, &crate::scripts::SETTLE);
        // A cluster's client resends commands on its own: a `settle` there
        // gets a key that makes a second run change nothing.
        #[cfg(feature = "cluster")]
        let once = match (self, resend) {
            (Conn::Cluster(_, ms), false) => crate::scripts::run_once(cmd, rand::random(), *ms),
            _ => None,
        };
        #[cfg(feature = "cluster")]
        let cmd = once.as_ref().unwrap_or(cmd);
        match self.send(cmd, resend).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // Boxed: a rare path, kept out of every call's future.
                Box::pin(self.load(script, cmd)).await?;
                self.send(cmd, resend).await
            }
            other => other,
        }
    }

    /// Loads `script` where `cmd`, a call of it, runs. On a cluster, only on
    /// the primary of `cmd`'s first key: the client's own `SCRIPT LOAD`
    /// waits for every primary, so one dead node would fail it.
    async fn load(&self, script: &Lua, cmd: &Cmd) -> RedisResult<Value> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(script.source);
        let key = match cmd.args_iter().nth(3) {
            Some(redis::Arg::Simple(key)) => key,
            _ => &[],
        };
        self.send_to(Scope::of(self, key), load).await
    }
}

/// How long (ms) a `settle` over a cluster keeps its own key (see
/// `scripts::run_once`): twice past every resend of the cluster's client
/// (4× the response timeout, plus a second), at least 10 s, at most a day.
#[cfg(feature = "cluster")]
fn once_ms(response: Duration) -> u64 {
    crate::ms(response)
        .saturating_mul(4)
        .saturating_add(1_000)
        .clamp(10_000, 86_400_000)
}

/// `cmd` through the manager, sent again once after a broken pipe when `resend`;
/// else it gets an error of its own (it may have run), not an outage.
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

pub(crate) fn redis_error(e: RedisError) -> BackendError {
    BackendError::new(format!("redis: {e}"))
}

/// Whether `e` means the store cannot be reached or serve now (the failure
/// policy answers), as opposed to a bad command or script.
pub(crate) fn is_unavailable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        // Moved, Ask, TryAgain and ClusterDown.
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown | ServerErrorKind::ReadOnly
            ) | ErrorKind::ClusterConnectionNotFound
        )
        // Writes refused (out of memory, a failed save, too few replicas),
        // or every command refused while a script runs too long.
        || matches!(e.code(), Some("OOM" | "MISCONF" | "NOREPLICAS" | "BUSY"))
}

/// Whether Redis itself answered `e` (an error reply, or a reply of the
/// wrong shape): proof that it is up.
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
        assert_eq!(once_ms(Duration::from_millis(500)), 10_000);
        assert_eq!(once_ms(Duration::from_millis(30_000)), 121_000);
        assert_eq!(once_ms(Duration::MAX), 86_400_000);
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
