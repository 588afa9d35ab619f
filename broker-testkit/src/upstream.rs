//! A simulated upstream: a real HTTP server on `127.0.0.1:0` that enforces
//! a strict quota counted when a request is *received*, and reports it in
//! rate-limit headers.
//!
//! - Every path shares the one budget, so several of our buckets (several
//!   resources or keys) calling the same server share it, as several
//!   buckets of one account share a supplier's per-account limit.
//! - [`Upstream::spawn_foreign`] runs a second, "foreign" client that spends
//!   the same budget over real HTTP, as another service using the same
//!   token would.
//! - Headers: `X-Ratelimit-*` (with `X-Ratelimit-Retry` on 429), or the
//!   OpenAI style (`x-ratelimit-*-requests` / `-tokens`, Go durations), or
//!   none; optionally `Retry-After` on 429; and the reported limit can be
//!   set larger than the real one, as a registry can be set below it.
//! - A token quota (TPM) charged by the `x-usage-tokens` request header,
//!   echoed in the JSON body as `{"usage": {"total_tokens": n}}`.
//! - An outage: refuse every request with 429 for a while from the start.
//!
//! Time is tokio's, so tests under `#[tokio::test(start_paused = true)]`
//! run it in virtual time. Wrap each call in [`no_time_passes`] there: while
//! a request is on the loopback wire the runtime looks idle, and tokio
//! would otherwise jump virtual time to the next timer mid-request.
//!
//! A request is tagged by the `x-client` header (default `ours`); answers
//! are counted per tag ([`Upstream::tally`]).

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
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go
    /// durations.
    OpenAi,
    /// No rate-limit headers.
    None,
}

/// How the simulated upstream behaves.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The request quota.
    pub requests: Quota,
    /// An optional token quota, charged by `x-usage-tokens`.
    pub tokens: Option<Quota>,
    /// The request limit announced in headers (default: the real capacity).
    pub reported_limit: Option<u64>,
    /// Which headers to send.
    pub headers: HeaderStyle,
    /// Send `Retry-After` (whole seconds, at least 1) on 429.
    pub retry_after: bool,
    /// Refuse every request with 429 for this long after the start.
    pub refuse_for: Duration,
    /// Send `X-Ratelimit-Reset` / `-Retry` in milliseconds (`"0.125"`)
    /// rather than whole seconds rounded up: for fast quotas, where whole
    /// seconds would hold a client far longer than the quota needs.
    pub precise_seconds: bool,
}

impl UpstreamConfig {
    /// A request quota with `X-Ratelimit-*` headers.
    pub fn new(requests: Quota) -> Self {
        Self {
            requests,
            tokens: None,
            reported_limit: None,
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

    /// Adds a token quota.
    pub fn tokens(mut self, tokens: Quota) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Announces `limit` instead of the real capacity.
    pub fn reported_limit(mut self, limit: u64) -> Self {
        self.reported_limit = Some(limit);
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
    tokens: Option<Level>,
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
            tokens: config.tokens.map(Level::new),
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

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers to requests tagged `client` so far.
    pub fn tally(&self, client: &str) -> Tally {
        self.lock().tally.get(client).copied().unwrap_or_default()
    }

    /// Time since the server started.
    pub fn elapsed(&self) -> Duration {
        self.lock().started.elapsed()
    }

    /// The most requests the quota could have admitted since the start:
    /// the burst plus the refill over the elapsed time (the outage aside).
    pub fn max_admissible(&self) -> u64 {
        let g = self.lock();
        let q = g.config.requests;
        let elapsed = g.started.elapsed().saturating_sub(g.config.refuse_for);
        let refill = elapsed.as_micros() * q.amount as u128 / q.period.as_micros().max(1);
        q.capacity + refill as u64
    }

    /// Starts a foreign client that spends the same budget over real HTTP,
    /// tagged `foreign`: `count` requests, one every `every`. It is greedy,
    /// as a client outside our control may be: a 429 is retried after
    /// [`FOREIGN_RETRY`], at most [`FOREIGN_ATTEMPTS`] times, so it takes
    /// its share of the budget. Its answers count in `tally("foreign")`.
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

/// Runs `fut` (an HTTP call over loopback) without virtual time passing
/// under a paused tokio clock; a no-op in real time. See the module docs.
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
pub const FOREIGN_ATTEMPTS: u32 = 1000;

/// The foreign client's pause after a 429.
pub const FOREIGN_RETRY: Duration = Duration::from_millis(10);

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

fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64();
    let m = (secs / 60.0).floor() as u64;
    let s = secs - (m * 60) as f64;
    if m > 0 {
        format!("{m}m{s:.0}s")
    } else {
        format!("{s:.3}s")
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_micros().div_ceil(1_000_000) as u64
}

async fn answer(State(inner): State<Arc<Mutex<Inner>>>, headers: HeaderMap) -> Response<Body> {
    let client = headers
        .get("x-client")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("ours")
        .to_owned();
    let usage: u64 = headers
        .get("x-usage-tokens")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
    let elapsed = g.started.elapsed();
    let now_us = elapsed.as_micros();
    g.requests.refill(now_us);
    if let Some(t) = g.tokens.as_mut() {
        t.refill(now_us);
    }
    let refusing = elapsed < g.config.refuse_for;
    let fits = !refusing && g.requests.has(1) && g.tokens.as_ref().is_none_or(|t| t.has(usage));
    if fits {
        g.requests.take(1);
        if let Some(t) = g.tokens.as_mut() {
            t.take(usage);
        }
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
    let limit = g
        .config
        .reported_limit
        .unwrap_or(g.config.requests.capacity);
    let (remaining, reset, retry) = if refusing {
        let left = g.config.refuse_for - elapsed;
        (0, left, left)
    } else {
        let retry = match g.tokens.as_ref().filter(|t| !t.has(usage)) {
            Some(t) => t.time_to(usage as u128).max(g.requests.to_one()),
            None => g.requests.to_one(),
        };
        (g.requests.remaining(), g.requests.to_full(), retry)
    };
    let secs = |d: Duration| {
        if g.config.precise_seconds {
            format!("{:.3}", d.as_micros().div_ceil(1000) as f64 / 1000.0)
        } else {
            ceil_secs(d).to_string()
        }
    };
    match g.config.headers {
        HeaderStyle::XRateLimit => {
            put("x-ratelimit-limit", limit.to_string());
            put("x-ratelimit-remaining", remaining.to_string());
            put("x-ratelimit-reset", secs(reset));
            if !fits {
                put("x-ratelimit-retry", secs(retry));
            }
        }
        HeaderStyle::OpenAi => {
            put("x-ratelimit-limit-requests", limit.to_string());
            put("x-ratelimit-remaining-requests", remaining.to_string());
            put("x-ratelimit-reset-requests", go_duration(reset));
            if let Some(t) = g.tokens.as_ref() {
                put("x-ratelimit-limit-tokens", t.quota.capacity.to_string());
                put("x-ratelimit-remaining-tokens", t.remaining().to_string());
                put("x-ratelimit-reset-tokens", go_duration(t.to_full()));
            }
        }
        HeaderStyle::None => {}
    }
    if !fits && g.config.retry_after {
        put("retry-after", ceil_secs(retry).max(1).to_string());
    }
    drop(g);
    let (status, body) = if fits {
        (
            StatusCode::OK,
            serde_json::json!({ "usage": { "total_tokens": usage } }),
        )
    } else {
        (
            StatusCode::TOO_MANY_REQUESTS,
            serde_json::json!({ "error": "rate limited" }),
        )
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

    #[test]
    fn go_durations_look_like_openai_ones() {
        assert_eq!(go_duration(Duration::from_millis(12)), "12ms");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
    }

    #[tokio::test(start_paused = true)]
    async fn counts_on_receive_and_reports_headers() {
        let up = Upstream::start(
            UpstreamConfig::new(Quota::per(2, Duration::from_secs(10))).reported_limit(10),
        )
        .await
        .unwrap();
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(no_time_passes(raw_get(up.addr(), "ours")).await.unwrap());
        }
        assert_eq!(codes, [200, 200, 429]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            no_time_passes(raw_get(up.addr(), "ours")).await.unwrap(),
            200
        );
        assert_eq!(up.tally("ours"), Tally { ok: 3, rejected: 1 });
        assert_eq!(up.max_admissible(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn foreign_client_spends_the_same_budget() {
        let up = Upstream::start(UpstreamConfig::new(Quota::per(5, Duration::from_secs(60))))
            .await
            .unwrap();
        up.spawn_foreign(Duration::from_millis(1), 3).await.unwrap();
        let mut ok = 0;
        for _ in 0..5 {
            if no_time_passes(raw_get(up.addr(), "ours")).await.unwrap() == 200 {
                ok += 1;
            }
        }
        assert_eq!(up.tally("foreign").ok, 3);
        assert_eq!(ok, 2);
    }
}
