//! A simulated upstream: a real HTTP server on `127.0.0.1:0` enforcing a
//! strict quota counted on *receive*, shared by every path, reported in
//! `X-Ratelimit-*` headers; an optional outage and a "foreign" client
//! ([`Upstream::spawn_foreign`]) spending the same budget. `x-usage-tokens`
//! is echoed as `{"usage": {"total_tokens": n}}`; answers are counted per
//! `x-client` tag (default `ours`). Time is tokio's: under a paused clock,
//! wrap each call in [`no_time_passes`].

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode};
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Tally;

/// `amount` per `period`, at most `capacity` at once (a token bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The burst: tokens held at most.
    pub capacity: u64,
    /// Tokens refilled per `period`.
    pub amount: u64,
    /// The refill period.
    pub period: Duration,
}

impl Quota {
    /// `amount` per `period`, burst `amount`.
    pub fn per(amount: u64, period: Duration) -> Self {
        Self {
            capacity: amount,
            amount,
            period,
        }
    }

    /// Sets the burst.
    pub fn burst(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }
}

/// Which rate-limit headers the upstream sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `X-Ratelimit-Limit`, `-Remaining`, `-Reset` (seconds to full), and
    /// `-Retry` (seconds to the next request) on 429.
    XRateLimit,
    /// No rate-limit headers.
    None,
}

/// How the simulated upstream behaves.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The request quota.
    pub requests: Quota,
    /// Which headers to send.
    pub headers: HeaderStyle,
    /// Send `Retry-After` (whole seconds, at least 1) on 429.
    pub retry_after: bool,
    /// Refuse every request with 429 for this long after the start.
    pub refuse_for: Duration,
    /// Send `X-Ratelimit-Reset` / `-Retry` with milliseconds (`"0.125"`),
    /// not whole seconds, for fast quotas.
    pub precise_seconds: bool,
}

impl UpstreamConfig {
    /// A request quota with `X-Ratelimit-*` headers.
    pub fn new(requests: Quota) -> Self {
        Self {
            requests,
            headers: HeaderStyle::XRateLimit,
            retry_after: false,
            refuse_for: Duration::ZERO,
            precise_seconds: false,
        }
    }

    /// Sends resets and retries in milliseconds.
    pub fn precise_seconds(mut self, on: bool) -> Self {
        self.precise_seconds = on;
        self
    }

    /// Sets the header style.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// Sends `Retry-After` on 429.
    pub fn retry_after(mut self, on: bool) -> Self {
        self.retry_after = on;
        self
    }

    /// Refuses everything for `d` from the start.
    pub fn refuse_for(mut self, d: Duration) -> Self {
        self.refuse_for = d;
        self
    }
}

const SCALE: u128 = 1_000_000;

/// A bucket in integer micro-tokens, refilled by elapsed microseconds.
#[derive(Debug)]
struct Level {
    quota: Quota,
    level: u128,
    last_us: u128,
}

impl Level {
    fn new(quota: Quota) -> Self {
        Self {
            quota,
            level: quota.capacity as u128 * SCALE,
            last_us: 0,
        }
    }

    fn refill(&mut self, now_us: u128) {
        let period = self.quota.period.as_micros().max(1);
        if now_us > self.last_us {
            let gained = (now_us - self.last_us) * self.quota.amount as u128 * SCALE / period;
            self.level = (self.level + gained).min(self.quota.capacity as u128 * SCALE);
            self.last_us = now_us;
        }
    }

    fn has(&self, n: u64) -> bool {
        self.level >= n as u128 * SCALE
    }

    fn take(&mut self, n: u64) {
        self.level -= n as u128 * SCALE;
    }

    fn remaining(&self) -> u64 {
        (self.level / SCALE) as u64
    }

    /// Time until `n` whole tokens are there.
    fn time_to(&self, n: u128) -> Duration {
        let want = n * SCALE;
        if self.level >= want {
            return Duration::ZERO;
        }
        let period = self.quota.period.as_micros().max(1);
        let per_us = self.quota.amount as u128 * SCALE;
        let us = ((want - self.level) * period).div_ceil(per_us);
        Duration::from_micros(us as u64)
    }

    fn to_full(&self) -> Duration {
        self.time_to(self.quota.capacity as u128)
    }

    fn to_one(&self) -> Duration {
        self.time_to(1)
    }
}

#[derive(Debug)]
struct Inner {
    config: UpstreamConfig,
    started: Instant,
    requests: Level,
    tally: HashMap<String, Tally>,
}

/// A running simulated upstream. Dropping it stops the server.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    server: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Upstream {
    /// Starts the server on a free loopback port, on the current runtime.
    pub async fn start(config: UpstreamConfig) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Mutex::new(Inner {
            requests: Level::new(config.requests),
            config,
            started: Instant::now(),
            tally: HashMap::new(),
        }));
        let app = Router::new().fallback(answer).with_state(inner.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            inner,
            server,
        })
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers to requests tagged `client` so far.
    pub fn tally(&self, client: &str) -> Tally {
        self.lock().tally.get(client).copied().unwrap_or_default()
    }

    /// Time since the server started.
    pub fn elapsed(&self) -> Duration {
        self.lock().started.elapsed()
    }

    /// Starts a greedy foreign client, tagged `foreign`, spending the same
    /// budget over real HTTP: `count` requests, one every `every`, each 429
    /// retried after 10 ms, up to 1,000 times.
    pub fn spawn_foreign(&self, every: Duration, count: u64) -> JoinHandle<()> {
        let addr = self.addr;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for _ in 0..count {
                tick.tick().await;
                for _ in 0..FOREIGN_ATTEMPTS {
                    if let Ok(200) = no_time_passes(raw_get(addr, "foreign")).await {
                        break;
                    }
                    tokio::time::sleep(FOREIGN_RETRY).await;
                }
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `fut` (a loopback HTTP call) so a paused tokio clock does not jump
/// ahead while the runtime looks idle; a no-op in real time.
pub async fn no_time_passes<F: Future>(fut: F) -> F::Output {
    let spinner = tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });
    let out = fut.await;
    spinner.abort();
    out
}

/// Attempts per foreign request before it gives up.
const FOREIGN_ATTEMPTS: u32 = 1000;

/// The foreign client's pause after a 429.
const FOREIGN_RETRY: Duration = Duration::from_millis(10);

/// One HTTP/1.1 GET over a fresh connection; the status code.
async fn raw_get(addr: SocketAddr, client: &str) -> std::io::Result<u16> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "GET /foreign HTTP/1.1\r\nHost: {addr}\r\nx-client: {client}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_micros().div_ceil(1_000_000) as u64
}

async fn answer(State(inner): State<Arc<Mutex<Inner>>>, headers: HeaderMap) -> Response<Body> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let client = header("x-client").unwrap_or("ours").to_owned();
    let usage: u64 = header("x-usage-tokens")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
    let elapsed = g.started.elapsed();
    g.requests.refill(elapsed.as_micros());
    let refusing = elapsed < g.config.refuse_for;
    let fits = !refusing && g.requests.has(1);
    if fits {
        g.requests.take(1);
    }
    let tally = g.tally.entry(client).or_default();
    if fits {
        tally.ok += 1;
    } else {
        tally.rejected += 1;
    }

    let mut out = HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            out.insert(name, v);
        }
    };
    let (remaining, reset, retry) = if refusing {
        let left = g.config.refuse_for - elapsed;
        (0, left, left)
    } else {
        let r = &g.requests;
        (r.remaining(), r.to_full(), r.to_one())
    };
    let secs = |d: Duration| {
        if g.config.precise_seconds {
            format!("{:.3}", d.as_micros().div_ceil(1000) as f64 / 1000.0)
        } else {
            ceil_secs(d).to_string()
        }
    };
    if g.config.headers == HeaderStyle::XRateLimit {
        put("x-ratelimit-limit", g.config.requests.capacity.to_string());
        put("x-ratelimit-remaining", remaining.to_string());
        put("x-ratelimit-reset", secs(reset));
        if !fits {
            put("x-ratelimit-retry", secs(retry));
        }
    }
    if !fits && g.config.retry_after {
        put("retry-after", ceil_secs(retry).max(1).to_string());
    }
    drop(g);
    let (status, body) = if fits {
        let usage = serde_json::json!({ "usage": { "total_tokens": usage } });
        (StatusCode::OK, usage)
    } else {
        let error = serde_json::json!({ "error": "rate limited" });
        (StatusCode::TOO_MANY_REQUESTS, error)
    };
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().extend(out);
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_counts_time_to_one_and_to_full() {
        let mut l = Level::new(Quota::per(60, Duration::from_secs(60)));
        for _ in 0..60 {
            assert!(l.has(1));
            l.take(1);
        }
        assert!(!l.has(1));
        assert_eq!(l.to_one(), Duration::from_secs(1));
        assert_eq!(l.to_full(), Duration::from_secs(60));
        l.refill(1_500_000);
        assert_eq!(l.remaining(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn counts_on_receive_and_reports_headers() {
        let up = Upstream::start(UpstreamConfig::new(Quota::per(2, Duration::from_secs(10))))
            .await
            .unwrap();
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(no_time_passes(raw_get(up.addr, "ours")).await.unwrap());
        }
        assert_eq!(codes, [200, 200, 429]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(no_time_passes(raw_get(up.addr, "ours")).await.unwrap(), 200);
        assert_eq!(up.tally("ours"), Tally { ok: 3, rejected: 1 });
    }

    #[tokio::test(start_paused = true)]
    async fn foreign_client_spends_the_same_budget() {
        let up = Upstream::start(UpstreamConfig::new(Quota::per(5, Duration::from_secs(60))))
            .await
            .unwrap();
        up.spawn_foreign(Duration::from_millis(1), 3).await.unwrap();
        let mut ok = 0;
        for _ in 0..5 {
            if no_time_passes(raw_get(up.addr, "ours")).await.unwrap() == 200 {
                ok += 1;
            }
        }
        assert_eq!(up.tally("foreign").ok, 3);
        assert_eq!(ok, 2);
    }
}
