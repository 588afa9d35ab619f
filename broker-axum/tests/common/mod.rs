//! Helpers shared by the socket tests: a server on a free loopback port, a
//! broker on a hand-driven clock, a body that never ends.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use broker_axum::{Pressure, PressureConfig};
use broker_core::{ManualClock, ResourceBroker, Store};
use broker_memory::MemoryBackend;
use bytes::Bytes;
use http_body::Frame;

/// A broker over an in-memory backend on a manual clock.
pub struct TestBroker {
    pub broker: ResourceBroker,
    pub backend: Arc<MemoryBackend>,
    pub clock: ManualClock,
}

impl TestBroker {
    pub fn new() -> Self {
        Self::bounded(MemoryBackend::new().state_bound())
    }

    /// A broker whose store holds at most `max_states` states.
    pub fn bounded(max_states: usize) -> Self {
        let clock = ManualClock::new();
        clock.set(1_000_000_000);
        let backend = Arc::new(MemoryBackend::with_clock(clock.clone()).max_states(max_states));
        let shared: Arc<dyn Store> = backend.clone();
        Self {
            broker: ResourceBroker::from_arc(shared),
            backend,
            clock,
        }
    }

    pub fn pressure(&self, config_json: &str) -> Pressure {
        let config = PressureConfig::from_json("test.json", config_json).expect("valid config");
        Pressure::new(self.broker.clone(), &config).expect("registers")
    }

    /// A counter of `resource` in `broker.stats()`.
    pub fn stat(&self, resource: &str, f: impl Fn(&broker_core::ResourceStats) -> u64) -> u64 {
        f(&self.broker.stats().resources[resource])
    }
}

/// Serves `app` on 127.0.0.1 on a free port; the server lives as long as
/// the test's runtime.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// Sends `n` GETs to `url` with the optional header, returns the statuses.
pub async fn statuses(
    client: &reqwest::Client,
    url: &str,
    header: Option<(&str, &str)>,
    n: usize,
) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut req = client.get(url);
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        out.push(req.send().await.unwrap().status().as_u16());
    }
    out
}

pub fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// Waits (bounded: at most `limit` of real time) until `cond` holds.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// A response body that sends a chunk every 20 ms and never ends.
pub struct Drip {
    interval: tokio::time::Interval,
}

impl Drip {
    pub fn new() -> Self {
        Self {
            interval: tokio::time::interval(Duration::from_millis(20)),
        }
    }
}

impl http_body::Body for Drip {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.interval.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"tick\n"))))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A GET of `path` as it goes on the wire (its bytes as they are), with
/// `Connection: close`.
pub fn get_line(path: &[u8]) -> Vec<u8> {
    let mut head = b"GET ".to_vec();
    head.extend_from_slice(path);
    head.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    head
}

/// Sends `head` (a request line and headers, written as they go on the
/// wire, with `Connection: close`) on a new connection to `addr` and
/// returns the response's status: for requests a client library will not
/// write (raw UTF-8 in the path, `OPTIONS *`, `CONNECT host:port`).
pub async fn raw_status(addr: SocketAddr, head: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a status line: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&got);
    line.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"))
}
