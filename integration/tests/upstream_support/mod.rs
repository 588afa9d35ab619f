//! A client of the simulated upstream, shared by the `upstream_*` tests:
//! one HTTP call turned into an [`Outcome`], headers read or ignored.
#![allow(dead_code)]

use std::time::{Duration, SystemTime};

use broker_core::{headers, Cost, Outcome, OutcomeClass, ResourceBroker, TokioClock};
use broker_memory::MemoryBackend;
use broker_testkit::upstream::no_time_passes;

/// Whether the caller reads the upstream's rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    /// Headers are parsed and reconciled.
    Reconcile,
    /// Headers are ignored: only 429s are fed back (penalize only).
    Ignore,
}

/// One-way network latency of [`call`] in virtual time: the upstream
/// receives a request this long after our bucket counted it sent.
pub const LATENCY: Duration = Duration::from_millis(20);

/// One GET to `url`, tagged `x-client: ours`, charging `tokens` on the
/// upstream's token quota, received [`LATENCY`] after it is sent, with no
/// virtual time passing on the wire. Success reports the usage from the
/// body.
pub async fn call(
    http: &reqwest::Client,
    url: &str,
    tokens: u64,
    mode: Headers,
) -> Outcome<u64, String> {
    tokio::time::sleep(LATENCY).await;
    no_time_passes(call_now(http, url, tokens, mode)).await
}

/// [`call`] for tests in real time: sent at once.
pub async fn call_now(
    http: &reqwest::Client,
    url: &str,
    tokens: u64,
    mode: Headers,
) -> Outcome<u64, String> {
    let sent = async {
        let r = http
            .get(url)
            .header("x-usage-tokens", tokens.to_string())
            .send()
            .await?;
        let status = r.status().as_u16();
        let seen = headers::parse(r.headers(), SystemTime::now());
        let body: serde_json::Value = r.json().await?;
        Ok::<_, reqwest::Error>((status, seen, body))
    }
    .await;
    let (status, seen, body) = match sent {
        Ok(x) => x,
        Err(e) => return Outcome::failed(OutcomeClass::Transient, e.to_string(), None),
    };
    let observed = (mode == Headers::Reconcile).then_some(seen);
    match OutcomeClass::from_status(status) {
        OutcomeClass::Ok => {
            let used = body["usage"]["total_tokens"].as_u64().unwrap_or(tokens);
            Outcome::Ok {
                value: used,
                usage: (tokens > 0).then_some(Cost::tokens(used)),
                observed,
            }
        }
        // Without headers, a 429 carries no Retry-After either.
        class => Outcome::failed(class, format!("status {status}"), observed),
    }
}

/// A broker on an in-memory backend that reads tokio's (paused) clock.
pub fn memory_broker() -> ResourceBroker {
    ResourceBroker::new(MemoryBackend::with_clock(TokioClock::new()))
}

/// A keep-alive HTTP client for loopback.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None::<Duration>)
        .build()
        .expect("reqwest client")
}
