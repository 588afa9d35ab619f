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
use axum::routing::post;
use axum::Router;
use resource_broker::axum::{FromExtension, Pressure, PressureConfig};
use resource_broker::{MemoryBackend, ResourceBroker};
use tower::ServiceBuilder;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{GlobalKeyExtractor, KeyExtractor};
use tower_governor::{GovernorError, GovernorLayer};

#[path = "../examples/webhook/mod.rs"]
mod webhook;

use webhook::{authenticate, receive_webhook, sign, Claims};

#[derive(Debug)]
struct Args {
    port: u16,
    rps: u64,
    concurrency: u32,
    tenant_rpm: u64,
    layer: String,
    print_token: Option<String>,
    help: bool,
}

const USAGE: &str = "\
usage: http_load_server [flags]
  --port N             port on 127.0.0.1 (3000; 0 picks a free one)
  --layer L            pressure (default), none, or governor (tower_governor
                       with tower's concurrency limit, the same numbers)
  --rps N              the webhook route's requests per second (100)
  --concurrency N      its concurrent requests (200; 0: no concurrency limit)
  --tenant-rpm N       each tenant's requests per minute (6000)
  --print-token TENANT print a bearer token for TENANT and exit
  --help               this text
";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 3000,
        rps: 100,
        concurrency: 200,
        tenant_rpm: 6000,
        layer: "pressure".into(),
        print_token: None,
        help: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--port" => args.port = number(value()?)?.try_into().map_err(|_| "bad --port")?,
            "--rps" => args.rps = number(value()?)?,
            "--concurrency" => {
                args.concurrency = number(value()?)?
                    .try_into()
                    .map_err(|_| "bad --concurrency")?
            }
            "--tenant-rpm" => args.tenant_rpm = number(value()?)?,
            "--layer" => args.layer = value()?,
            "--print-token" => args.print_token = Some(value()?),
            "--help" | "-h" => args.help = true,
            other => return Err(format!("unknown flag {other} (--help lists them)")),
        }
    }
    Ok(args)
}

/// The example's pressure config, from the flags.
fn pressure_config(args: &Args) -> Result<PressureConfig, String> {
    let concurrency = match args.concurrency {
        0 => String::new(),
        n => format!(r#", "maxConcurrentRequests": {n}"#),
    };
    let json = format!(
        r#"{{
        "enabled": true,
        "perRoute": [{{
            "resource": "gateway:route:webhooks",
            "pathPrefix": "/api/v1/webhooks",
            "limits": {{ "requestsPerSecond": {rps}{concurrency} }}
        }}],
        "perTenant": {{ "enabled": true, "limits": {{ "requestsPerMinute": {rpm} }} }}
    }}"#,
        rps = args.rps,
        rpm = args.tenant_rpm
    );
    PressureConfig::from_json("flags", &json).map_err(|e| e.to_string())
}

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
fn governor_app(args: &Args, webhooks: Router) -> Result<Router, String> {
    let (route_period, route_burst) = governor_rate("--rps", args.rps, Duration::from_secs(1))?;
    let route = GovernorConfigBuilder::default()
        .period(route_period)
        .burst_size(route_burst)
        .key_extractor(GlobalKeyExtractor)
        .finish()
        .ok_or("bad governor route config")?;
    let (tenant_period, tenant_burst) =
        governor_rate("--tenant-rpm", args.tenant_rpm, Duration::from_secs(60))?;
    let tenant = GovernorConfigBuilder::default()
        .period(tenant_period)
        .burst_size(tenant_burst)
        .key_extractor(TenantKey)
        .finish()
        .ok_or("bad governor tenant config")?;
    // tower's concurrency limit holds its slot until the response head is
    // ready (this crate's permit, until the body ends). Two stacks rather
    // than an optional layer, so neither pays for a dispatch.
    Ok(match args.concurrency {
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

fn app(args: &Args) -> Result<Router, String> {
    let webhooks = Router::new().route("/api/v1/webhooks/{source}", post(receive_webhook));
    match args.layer.as_str() {
        "pressure" => {
            let broker = ResourceBroker::new(MemoryBackend::new());
            let pressure =
                Pressure::new(broker, &pressure_config(args)?).map_err(|e| e.to_string())?;
            // One `Router::layer` for the whole stack, as in the example.
            Ok(webhooks.layer(
                ServiceBuilder::new()
                    .layer(pressure.layer())
                    .layer(middleware::from_fn(authenticate))
                    .layer(
                        pressure
                            .tenant_layer(FromExtension::new(|c: &Claims| c.namespace_id.as_str())),
                    ),
            ))
        }
        "none" => Ok(webhooks.layer(middleware::from_fn(authenticate))),
        "governor" => governor_app(args, webhooks),
        other => Err(format!(
            "--layer {other}: expected pressure, none or governor"
        )),
    }
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("http_load_server: {e}");
            std::process::exit(2);
        }
    };
    if args.help {
        print!("{USAGE}");
        return;
    }
    if let Some(tenant) = &args.print_token {
        println!("{}", sign(tenant));
        return;
    }
    let result = async {
        let app = app(&args)?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
            .await
            .map_err(|e| format!("bind 127.0.0.1:{}: {e}", args.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!(
            "http_load_server listening on http://{addr} (layer: {})",
            args.layer
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    if let Err(e) = result {
        eprintln!("http_load_server: {e}");
        std::process::exit(1);
    }
}
