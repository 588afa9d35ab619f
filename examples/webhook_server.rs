//! A webhook receiver with inbound pressure: the webhook route at 100 rps
//! and 200 concurrent requests, a per-tenant quota keyed from a (fake-)
//! signed bearer token, and the stats endpoint behind an admin token.
//!
//! ```text
//! cargo run --example webhook_server --features axum,redis -- --port 3000
//! cargo run --example webhook_server --features axum,redis -- --print-token acme      # a bearer token for tenant "acme"
//! curl -X POST -H "Authorization: Bearer $(cargo run -q --example webhook_server --features axum,redis -- --print-token acme)" \
//!      http://127.0.0.1:3000/api/v1/webhooks/stripe
//! curl -H "x-admin-token: dev-admin" http://127.0.0.1:3000/admin/pressure/stats
//! ```
//!
//! Two instances share one limit with `--redis redis://127.0.0.1:6379/`
//! (each on its own `--port`); `--help` lists every flag.
//!
//! Stops cleanly on Ctrl-C or SIGTERM.

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::Router;
use resource_broker::axum::{stats_router, Pressure, PressureConfig};
use resource_broker::ResourceBroker;

mod webhook;

use webhook::{flags_config, flags_or_exit, pressured_webhooks, serve, Flags};

const USAGE: &str = "  --redis URL          keep the limits in Redis instead of in memory
  --config FILE        read the `pressure` object from a JSON config document
  --admin-token T      the token the stats endpoint requires (dev-admin)
";

fn pressure_config(flags: &Flags) -> Result<PressureConfig, String> {
    match flags.own("--config") {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            PressureConfig::from_document(path, &text).map_err(|e| e.to_string())
        }
        None => flags_config(flags),
    }
}

async fn broker(flags: &Flags) -> Result<ResourceBroker, String> {
    Ok(match flags.own("--redis") {
        Some(url) => ResourceBroker::new(
            resource_broker::redis::RedisBackend::connect(url)
                .await
                .map_err(|e| format!("redis {url}: {e}"))?,
        ),
        None => ResourceBroker::new(resource_broker::MemoryBackend::new()),
    })
}

/// The stats endpoint, behind the admin token.
fn admin(broker: ResourceBroker, token: String) -> Router {
    stats_router(broker).route_layer(middleware::from_fn(
        move |headers: HeaderMap, req: Request, next: Next| {
            let ok = headers
                .get("x-admin-token")
                .is_some_and(|v| v == token.as_str());
            async move {
                match ok {
                    true => next.run(req).await,
                    false => StatusCode::UNAUTHORIZED.into_response(),
                }
            }
        },
    ))
}

fn app(flags: &Flags, broker: ResourceBroker) -> Result<Router, String> {
    let pressure =
        Pressure::new(broker.clone(), &pressure_config(flags)?).map_err(|e| e.to_string())?;
    let token = flags.own("--admin-token").unwrap_or("dev-admin").to_owned();
    Ok(pressured_webhooks(&pressure).merge(admin(broker, token)))
}

#[tokio::main]
async fn main() {
    let Some(flags) = flags_or_exit(
        "webhook_server",
        USAGE,
        &["--redis", "--config", "--admin-token"],
    ) else {
        return;
    };
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let result = async {
        let app = app(&flags, broker(&flags).await?)?;
        let store = if flags.own("--redis").is_some() {
            "redis"
        } else {
            "memory"
        };
        serve(
            "webhook_server",
            flags.port,
            app,
            &format!("store: {store}"),
        )
        .await
    }
    .await;
    if let Err(e) = result {
        eprintln!("webhook_server: {e}");
        std::process::exit(1);
    }
}
