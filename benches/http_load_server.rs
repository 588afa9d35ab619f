//! The server `bench/http_load.sh` loads: the webhook route of
//! `examples/webhook_server.rs` (a signed bearer token, a per-route and a
//! per-tenant limit) behind one of three stacks, chosen by `--layer`:
//!
//! - `pressure`: this crate's route and tenant stages, as the example has them;
//! - `none`: authentication only, no limiter;
//! - `governor`: tower_governor with tower's concurrency limit, the same numbers.
//!
//! ```text
//! cargo run --release -p resource-broker-benches --bin http_load_server -- --layer governor
//! ```

#![forbid(unsafe_code)]

use std::time::Duration;

use axum::middleware;
use axum::Router;
use resource_broker::axum::Pressure;
use resource_broker::{MemoryBackend, ResourceBroker};
use tower::ServiceBuilder;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{GlobalKeyExtractor, KeyExtractor};
use tower_governor::{GovernorError, GovernorLayer};

#[path = "../examples/webhook/mod.rs"]
mod webhook;

use webhook::{
    authenticate, flags_config, flags_or_exit, pressured_webhooks, serve, webhooks, Claims, Flags,
};

const USAGE: &str = "  --layer L            pressure, none or governor (pressure)
";

/// tower_governor's key for the per-tenant quota: the verified namespace.
#[derive(Clone)]
struct TenantKey;

impl KeyExtractor for TenantKey {
    type Key = String;

    fn extract<T>(&self, req: &axum::http::Request<T>) -> Result<Self::Key, GovernorError> {
        req.extensions()
            .get::<Claims>()
            .map(|c| c.namespace_id.clone())
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// `amount` per `period` as governor's (replenish period, burst); as this
/// crate's config does, a limit of 0 is refused, not raised to 1.
fn governor_rate(flag: &str, amount: u64, period: Duration) -> Result<(Duration, u32), String> {
    match amount {
        0 => Err(format!("{flag} 0: a limit must be at least 1")),
        n => {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            Ok((period / n, n))
        }
    }
}

/// The tower_governor stack: a global limit for the route, tower's
/// concurrency limit (unless `--concurrency 0`), a keyed limit per tenant.
fn governor_app(flags: &Flags, webhooks: Router) -> Result<Router, String> {
    let (route_period, route_burst) = governor_rate("--rps", flags.rps, Duration::from_secs(1))?;
    let route = GovernorConfigBuilder::default()
        .period(route_period)
        .burst_size(route_burst)
        .key_extractor(GlobalKeyExtractor)
        .finish()
        .ok_or("bad governor route config")?;
    let (tenant_period, tenant_burst) =
        governor_rate("--tenant-rpm", flags.tenant_rpm, Duration::from_secs(60))?;
    let tenant = GovernorConfigBuilder::default()
        .period(tenant_period)
        .burst_size(tenant_burst)
        .key_extractor(TenantKey)
        .finish()
        .ok_or("bad governor tenant config")?;
    // tower's concurrency limit holds its slot until the response head is
    // ready (this crate's permit, until the body ends). Two stacks rather
    // than an optional layer, so neither pays for a dispatch.
    Ok(match flags.concurrency {
        0 => webhooks.layer(
            ServiceBuilder::new()
                .layer(GovernorLayer::new(route))
                .layer(middleware::from_fn(authenticate))
                .layer(GovernorLayer::new(tenant)),
        ),
        n => webhooks.layer(
            ServiceBuilder::new()
                .layer(GovernorLayer::new(route))
                .layer(tower::limit::GlobalConcurrencyLimitLayer::new(n as usize))
                .layer(middleware::from_fn(authenticate))
                .layer(GovernorLayer::new(tenant)),
        ),
    })
}

fn app(flags: &Flags) -> Result<Router, String> {
    match flags.own("--layer").unwrap_or("pressure") {
        "pressure" => {
            let broker = ResourceBroker::new(MemoryBackend::new());
            let pressure =
                Pressure::new(broker, &flags_config(flags)?).map_err(|e| e.to_string())?;
            Ok(pressured_webhooks(&pressure))
        }
        "none" => Ok(webhooks().layer(middleware::from_fn(authenticate))),
        "governor" => governor_app(flags, webhooks()),
        other => Err(format!(
            "--layer {other}: expected pressure, none or governor"
        )),
    }
}

#[tokio::main]
async fn main() {
    let Some(flags) = flags_or_exit("http_load_server", USAGE, &["--layer"]) else {
        return;
    };
    let layer = format!("layer: {}", flags.own("--layer").unwrap_or("pressure"));
    let result = async { serve("http_load_server", flags.port, app(&flags)?, &layer).await }.await;
    if let Err(e) = result {
        eprintln!("http_load_server: {e}");
        std::process::exit(1);
    }
}
