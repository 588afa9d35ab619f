//! A connection of its own to one server for the call that finds it free:
//! that call writes its command and reads the reply on its own task, with
//! no driver task and no channel in between (the multiplexed
//! `ConnectionManager` hands every command to its driver task and the reply
//! back). A lone call, the common case at low load, so costs the client
//! one write, one wait for the socket and one read.
//!
//! - One call at a time: a call that finds the connection busy, broken or
//!   not yet connected goes through the manager, so nothing ever waits for
//!   this connection.
//! - A call that fails on it (I/O error, timeout, or its caller gone
//!   before the reply) leaves it closed, exactly as the manager's in-flight
//!   request would fail; the connection is opened again in the background
//!   (at once, then at most once a second while that fails), and meanwhile
//!   calls use the manager.
//! - Plain TCP or Unix socket with RESP2, `AUTH` and `SELECT` as the URL
//!   says; for a TLS or RESP3 URL there is no such connection and every call
//!   uses the manager.
//! - Busy polling (the builder's `busy_poll`): while no other call is in
//!   flight, the call checks its socket for its reply for up to the budget
//!   before it sleeps, unless the connection's [`PollGuard`] says recent
//!   polls ran out of budget without the reply (Redis farther away than
//!   the budget); see [`crate::poll_guard`]. A reopened connection starts
//!   with a new guard (it may reach another host).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Arg, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, ProtocolVersion, RedisError};
use redis::{RedisResult, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::poll_guard::PollGuard;

/// How long a failed (re)connection waits before the next attempt.
const RETRY: Duration = Duration::from_secs(1);

/// A link unused for this long is checked for a close by the server (its
/// idle `timeout`, a proxy's) before a call is written on it.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// Where to connect, and what to say first.
#[derive(Debug)]
struct Target {
    addr: Addr,
    /// `AUTH` and `SELECT`, packed, when the URL asks for them.
    handshake: Vec<u8>,
    /// Replies the handshake gets.
    handshake_replies: usize,
    connect_timeout: Duration,
    /// How long a call polls for its reply before it waits for the socket.
    busy_poll: Duration,
}

#[derive(Debug)]
enum Addr {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Stream {
    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(bytes).await,
            #[cfg(unix)]
            Stream::Unix(s) => s.write_all(bytes).await,
        }
    }

    fn try_read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read_buf(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.try_read_buf(buf),
        }
    }

    async fn read_buf(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_buf(buf).await,
            #[cfg(unix)]
            Stream::Unix(s) => s.read_buf(buf).await,
        }
    }
}

/// An open connection, its buffer (the command, then the reply) and what
/// its busy polls found.
struct Link {
    stream: Stream,
    buf: Vec<u8>,
    guard: PollGuard,
    /// When the last call on it ended.
    used: Instant,
}

impl Link {
    /// Whether the link can take a call: one idle for a while is checked
    /// first for a close by the server (read at once: nothing to read is
    /// a live link; an end of file, stray bytes or an error is not).
    fn fit(&mut self) -> bool {
        if self.used.elapsed() < IDLE_CHECK {
            return true;
        }
        self.buf.clear();
        matches!(self.stream.try_read_buf(&mut self.buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

enum Slot {
    /// Free for the next call.
    Ready(Link),
    /// A call is using it.
    Busy,
    /// Being opened in the background.
    Connecting,
    /// Closed; opened again by the first call at or after `retry_at`.
    Down { retry_at: Instant },
}

/// The connection of one backend.
pub(crate) struct Direct {
    target: Target,
    slot: Mutex<Slot>,
    /// Calls in flight through the manager meanwhile: while there are any,
    /// the call on this connection does not busy-poll (the client's core
    /// has other work).
    others: AtomicUsize,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct")
            .field("target", &self.target.addr)
            .finish_non_exhaustive()
    }
}

impl Direct {
    /// The connection for `info`, not yet open; `None` when the URL asks
    /// for what it does not do (TLS, RESP3).
    pub(crate) fn new(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        busy_poll: Duration,
    ) -> Option<Arc<Self>> {
        let addr = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            _ => return None,
        };
        let settings = info.redis_settings();
        if settings.protocol() != ProtocolVersion::RESP2 {
            return None;
        }
        let mut handshake = Vec::new();
        let mut handshake_replies = 0;
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            auth.write_packed_command(&mut handshake);
            handshake_replies += 1;
        }
        if settings.db() != 0 {
            redis::cmd("SELECT")
                .arg(settings.db())
                .write_packed_command(&mut handshake);
            handshake_replies += 1;
        }
        Some(Arc::new(Self {
            target: Target {
                addr,
                handshake,
                handshake_replies,
                connect_timeout,
                busy_poll,
            },
            slot: Mutex::new(Slot::Down {
                retry_at: Instant::now(),
            }),
            others: AtomicUsize::new(0),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the connection now (when the backend connects), within the
    /// connect timeout; on failure, calls use the manager until a later
    /// attempt succeeds.
    pub(crate) async fn open(&self) {
        *self.lock() = Slot::Connecting;
        self.opened(tokio::time::timeout(self.target.connect_timeout, connect(&self.target)).await);
    }

    fn opened(&self, r: Result<RedisResult<Link>, tokio::time::error::Elapsed>) {
        *self.lock() = match r {
            Ok(Ok(link)) => Slot::Ready(link),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "direct redis connection failed; calls use the shared one");
                Slot::Down {
                    retry_at: Instant::now() + RETRY,
                }
            }
            Err(_) => Slot::Down {
                retry_at: Instant::now() + RETRY,
            },
        };
    }

    /// Runs `cmd` on this connection if it is free: `None` when it is busy,
    /// broken or not open yet (the caller then uses the manager).
    pub(crate) async fn query(self: &Arc<Self>, cmd: &Cmd) -> Option<RedisResult<Value>> {
        let link = self.take()?;
        let mut held = Held {
            direct: self,
            link: Some(link),
        };
        let link = held.link.as_mut()?;
        if !link.fit() {
            // Closed while idle: `held` closes it too, and this call goes
            // through the manager.
            return None;
        }
        // A reply, an error reply included: the connection is in step, and
        // handed back. An I/O or protocol error: `held` closes it.
        let reply = exchange(link, cmd, self.target.busy_poll, &self.others).await;
        link.used = Instant::now();
        if reply.is_ok() {
            held.give_back();
        }
        Some(reply.and_then(Value::extract_error))
    }

    /// Runs `call`, a call through the manager, counted as one in flight
    /// meanwhile (see `others`).
    pub(crate) async fn beside<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        struct Count<'a>(&'a AtomicUsize);
        impl Drop for Count<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.others.fetch_add(1, Ordering::Relaxed);
        let _count = Count(&self.others);
        call.await
    }

    /// Takes the connection if it is free; starts reopening it if it is
    /// down and its retry time has come.
    fn take(self: &Arc<Self>) -> Option<Link> {
        let mut slot = self.lock();
        match std::mem::replace(&mut *slot, Slot::Busy) {
            Slot::Ready(link) => return Some(link),
            Slot::Down { retry_at } if Instant::now() >= retry_at => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    *slot = Slot::Connecting;
                    let this = self.clone();
                    runtime.spawn(async move {
                        let timeout = this.target.connect_timeout;
                        this.opened(tokio::time::timeout(timeout, connect(&this.target)).await);
                    });
                } else {
                    *slot = Slot::Down { retry_at };
                }
            }
            other => *slot = other,
        }
        None
    }
}

/// The connection while a call uses it: handed back by
/// [`Held::give_back`], else closed when dropped (a failed call, or a
/// caller gone before the reply, whose reply would otherwise be read by the
/// next call).
struct Held<'a> {
    direct: &'a Arc<Direct>,
    link: Option<Link>,
}

impl Held<'_> {
    fn give_back(&mut self) {
        if let Some(link) = self.link.take() {
            *self.direct.lock() = Slot::Ready(link);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.link.take().is_some() {
            // Reopened by the next call.
            *self.direct.lock() = Slot::Down {
                retry_at: Instant::now(),
            };
        }
    }
}

async fn connect(target: &Target) -> RedisResult<Link> {
    let stream = match &target.addr {
        Addr::Tcp(host, port) => {
            let s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            s.set_nodelay(true)?;
            Stream::Tcp(s)
        }
        #[cfg(unix)]
        Addr::Unix(path) => Stream::Unix(tokio::net::UnixStream::connect(path).await?),
    };
    let mut link = Link {
        stream,
        buf: Vec::with_capacity(512),
        guard: PollGuard::default(),
        used: Instant::now(),
    };
    if target.handshake_replies > 0 {
        link.stream.write_all(&target.handshake).await?;
        for _ in 0..target.handshake_replies {
            read_reply(&mut link).await?.extract_error()?;
        }
    }
    Ok(link)
}

/// Writes `cmd` and reads its reply (an error reply is a `Value` here),
/// busy-polling for it first when `busy_poll` is not zero, no other call is
/// in flight and the connection's guard allows it.
async fn exchange(
    link: &mut Link,
    cmd: &Cmd,
    busy_poll: Duration,
    others: &AtomicUsize,
) -> RedisResult<Value> {
    link.buf.clear();
    pack(cmd, &mut link.buf);
    link.stream.write_all(&link.buf).await?;
    link.buf.clear();
    if !busy_poll.is_zero() && others.load(Ordering::Relaxed) == 0 && link.guard.should_poll() {
        let started = Instant::now();
        loop {
            match link.stream.try_read_buf(&mut link.buf) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(_) => match frame_end(&link.buf, 0)? {
                    Some(end) if end == link.buf.len() => {
                        link.guard.hit();
                        return parse(&link.buf, 0).map(|(v, _)| v);
                    }
                    Some(_) => return Err(protocol_error("bytes after the reply")),
                    None => {}
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Another call started: the core has other work. This
                    // poll says nothing about the round trip.
                    if others.load(Ordering::Relaxed) > 0 {
                        break;
                    }
                    if started.elapsed() >= busy_poll {
                        link.guard.miss();
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    read_more(link).await
}

/// Appends `cmd` in RESP (as `Cmd::write_packed_command` writes it, for a
/// third of its instructions).
fn pack(cmd: &Cmd, buf: &mut Vec<u8>) {
    let args = cmd.args_iter();
    buf.push(b'*');
    push_decimal(buf, args.len());
    buf.extend_from_slice(b"\r\n");
    for arg in args {
        let Arg::Simple(bytes) = arg else {
            // A cursor argument (SCAN): not one of ours; the crate packs it.
            buf.clear();
            cmd.write_packed_command(buf);
            return;
        };
        buf.push(b'$');
        push_decimal(buf, bytes.len());
        buf.extend_from_slice(b"\r\n");
        buf.extend_from_slice(bytes);
        buf.extend_from_slice(b"\r\n");
    }
}

fn push_decimal(buf: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

/// Reads one reply into `link.buf` (which it clears) and parses it.
async fn read_reply(link: &mut Link) -> RedisResult<Value> {
    link.buf.clear();
    read_more(link).await
}

/// Reads the rest of the reply that starts in `link.buf`, and parses it.
async fn read_more(link: &mut Link) -> RedisResult<Value> {
    loop {
        if link.stream.read_buf(&mut link.buf).await? == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        match frame_end(&link.buf, 0)? {
            Some(end) if end == link.buf.len() => return parse(&link.buf, 0).map(|(v, _)| v),
            // Only one command is ever in flight: more than its reply is a
            // protocol error.
            Some(_) => return Err(protocol_error("bytes after the reply")),
            None => {}
        }
    }
}

/// The RESP2 value at `at` of a complete reply (see [`frame_end`]) and
/// where it ends, as the `redis` crate's parser reads it (which zeroes a
/// buffer of its own on every call: it parses error replies here).
fn parse(buf: &[u8], at: usize) -> RedisResult<(Value, usize)> {
    let line_end = at
        + buf[at..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| protocol_error("incomplete reply"))?;
    let line = &buf[at + 1..line_end];
    let after_line = line_end + 2;
    let number = || -> RedisResult<i64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol_error("bad number"))
    };
    Ok(match buf[at] {
        b':' => (Value::Int(number()?), after_line),
        b'+' if line == b"OK" => (Value::Okay, after_line),
        b'+' => (
            Value::SimpleString(String::from_utf8_lossy(line).into_owned()),
            after_line,
        ),
        b'-' => (redis::parse_redis_value(&buf[at..after_line])?, after_line),
        b'$' => match number()? {
            n if n < 0 => (Value::Nil, after_line),
            n => {
                let end = after_line + n as usize;
                (Value::BulkString(buf[after_line..end].to_vec()), end + 2)
            }
        },
        b'*' => match number()? {
            n if n < 0 => (Value::Nil, after_line),
            n => {
                let mut items = Vec::with_capacity(n as usize);
                let mut end = after_line;
                for _ in 0..n {
                    let (item, next) = parse(buf, end)?;
                    items.push(item);
                    end = next;
                }
                (Value::Array(items), end)
            }
        },
        _ => return Err(protocol_error("unknown reply type")),
    })
}

fn protocol_error(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "unexpected reply from redis",
        what.to_owned(),
    ))
}

/// Where the RESP2 value that starts at `at` ends, or `None` if `buf` does
/// not hold all of it yet.
fn frame_end(buf: &[u8], at: usize) -> RedisResult<Option<usize>> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(line) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let after_line = at + line + 2;
    match kind {
        b'+' | b'-' | b':' => Ok(Some(after_line)),
        b'$' | b'*' => {
            let n: i64 = std::str::from_utf8(&buf[at + 1..at + line])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol_error("bad length"))?;
            if n < 0 {
                return Ok(Some(after_line));
            }
            if kind == b'$' {
                let end = after_line + n as usize + 2;
                return Ok((buf.len() >= end).then_some(end));
            }
            let mut end = after_line;
            for _ in 0..n {
                match frame_end(buf, end)? {
                    Some(e) => end = e,
                    None => return Ok(None),
                }
            }
            Ok(Some(end))
        }
        _ => Err(protocol_error("unknown reply type")),
    }
}

#[cfg(test)]
mod tests {
    use super::{frame_end, pack, parse};

    #[test]
    fn commands_are_packed_as_the_redis_crate_packs_them() {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("1b8caaafa0c9aebaff746f5d441175db69457642")
            .arg(2)
            .arg("rb:{bench}:b")
            .arg("rb:{bench}:l")
            .arg("")
            .arg(1000)
            .arg(1.5f64)
            .arg(vec![b'x'; 1234]);
        let mut ours = Vec::new();
        pack(&cmd, &mut ours);
        assert_eq!(ours, cmd.get_packed_command());
    }

    #[test]
    fn a_reply_is_complete_only_with_all_its_bytes() {
        let whole: &[&[u8]] = &[
            b":1\r\n",
            b"+OK\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b"$3\r\n1.5\r\n",
            b"$-1\r\n",
            b"*2\r\n:1\r\n$4\r\n2500\r\n",
            b"*2\r\n*1\r\n:0\r\n$0\r\n\r\n",
            b"*-1\r\n",
        ];
        for reply in whole {
            assert_eq!(frame_end(reply, 0).unwrap(), Some(reply.len()), "{reply:?}");
            for cut in 0..reply.len() {
                assert_eq!(
                    frame_end(&reply[..cut], 0).unwrap(),
                    None,
                    "{reply:?} cut at {cut}"
                );
            }
        }
        assert!(frame_end(b"?x\r\n", 0).is_err());
        assert!(frame_end(b"$x\r\n", 0).is_err());
    }

    #[test]
    fn replies_read_as_the_redis_crate_reads_them() {
        let replies: &[&[u8]] = &[
            b":1\r\n",
            b":-42\r\n",
            b"+OK\r\n",
            b"+PONG\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b"-ERR user_script:1: boom\r\n",
            b"$3\r\n1.5\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"*2\r\n:1\r\n$4\r\n2500\r\n",
            b"*3\r\n*1\r\n:0\r\n$-1\r\n-ERR inner\r\n",
            b"*0\r\n",
            b"*-1\r\n",
        ];
        for reply in replies {
            let (value, end) = parse(reply, 0).unwrap();
            assert_eq!(end, reply.len(), "{reply:?}");
            assert_eq!(value, redis::parse_redis_value(reply).unwrap(), "{reply:?}");
        }
    }
}
