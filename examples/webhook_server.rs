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
use axum::routing::post;
use axum::Router;
use resource_broker::axum::{stats_router, FromExtension, Pressure, PressureConfig};
use resource_broker::ResourceBroker;
use tower::ServiceBuilder;

mod webhook;

use webhook::{authenticate, receive_webhook, sign, Claims};

#[derive(Debug)]
struct Args {
    port: u16,
    redis: Option<String>,
    config: Option<String>,
    rps: u64,
    concurrency: u32,
    tenant_rpm: u64,
    admin_token: String,
    print_token: Option<String>,
    help: bool,
}

const USAGE: &str = "\
usage: webhook_server [flags]
  --port N             port on 127.0.0.1 (3000; 0 picks a free one)
  --redis URL          keep the limits in Redis instead of in memory
  --config FILE        read the `pressure` object from a JSON config document
  --rps N              the webhook route's requests per second (100)
  --concurrency N      its concurrent requests (200; 0: no concurrency limit)
  --tenant-rpm N       each tenant's requests per minute (6000)
  --admin-token T      the token the stats endpoint requires (dev-admin)
  --print-token TENANT print a bearer token for TENANT and exit
  --help               this text
";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 3000,
        redis: None,
        config: None,
        rps: 100,
        concurrency: 200,
        tenant_rpm: 6000,
        admin_token: "dev-admin".into(),
        print_token: None,
        help: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--port" => args.port = number(value()?)?.try_into().map_err(|_| "bad --port")?,
            "--redis" => args.redis = Some(value()?),
            "--config" => args.config = Some(value()?),
            "--rps" => args.rps = number(value()?)?,
            "--concurrency" => {
                args.concurrency = number(value()?)?
                    .try_into()
                    .map_err(|_| "bad --concurrency")?
            }
            "--tenant-rpm" => args.tenant_rpm = number(value()?)?,
            "--admin-token" => args.admin_token = value()?,
            "--print-token" => args.print_token = Some(value()?),
            "--help" | "-h" => args.help = true,
            other => return Err(format!("unknown flag {other} (--help lists them)")),
        }
    }
    Ok(args)
}

fn pressure_config(args: &Args) -> Result<PressureConfig, String> {
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        return PressureConfig::from_document(path, &text).map_err(|e| e.to_string());
    }
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

async fn broker(args: &Args) -> Result<ResourceBroker, String> {
    Ok(match &args.redis {
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

fn app(args: &Args, broker: ResourceBroker) -> Result<Router, String> {
    let config = pressure_config(args)?;
    let pressure = Pressure::new(broker.clone(), &config).map_err(|e| e.to_string())?;
    // One `Router::layer` for the whole stack (axum boxes and clones each
    // layer it is given per request): the route stage before
    // authentication, the tenant stage after it.
    let webhooks = Router::new()
        .route("/api/v1/webhooks/{source}", post(receive_webhook))
        .layer(
            ServiceBuilder::new()
                .layer(pressure.layer())
                .layer(middleware::from_fn(authenticate))
                .layer(
                    pressure.tenant_layer(FromExtension::new(|c: &Claims| c.namespace_id.as_str())),
                ),
        );
    Ok(webhooks.merge(admin(broker, args.admin_token.clone())))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("webhook_server: {e}");
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
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let result = async {
        let broker = broker(&args).await?;
        let app = app(&args, broker)?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
            .await
            .map_err(|e| format!("bind 127.0.0.1:{}: {e}", args.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!(
            "webhook_server listening on http://{addr} (store: {})",
            if args.redis.is_some() {
                "redis"
            } else {
                "memory"
            }
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(|e| e.to_string())?;
        println!("webhook_server stopped");
        Ok::<(), String>(())
    }
    .await;
    if let Err(e) = result {
        eprintln!("webhook_server: {e}");
        std::process::exit(1);
    }
}
