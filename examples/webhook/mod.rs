//! The webhook route the example serves (and the load bench serves too,
//! under every layer it compares): a bearer token "signed" for a tenant,
//! authentication that puts its claims in the request, the receiver, and
//! the flags, config and server loop both binaries share.

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use resource_broker::axum::{FromExtension, Pressure, PressureConfig};
use sha2::{Digest, Sha256};
use tower::ServiceBuilder;

/// The key the example "signs" tokens with. A real server verifies a JWT.
const SIGNING_SECRET: &str = "example-signing-secret";

/// What authentication puts in the request: the tenant's namespace.
#[derive(Clone, Debug)]
pub struct Claims {
    /// The tenant the token was signed for.
    pub namespace_id: String,
}

/// The signature of `tenant`: the first 8 bytes of SHA-256 over the secret,
/// `:` and the tenant, in hex (what `resource_broker::store::keys::fingerprint` gives
/// for `"<secret>:<tenant>"`), made without allocating: it is checked on
/// every request.
fn signature(tenant: &str) -> [u8; 16] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::new()
        .chain_update(SIGNING_SECRET)
        .chain_update(":")
        .chain_update(tenant)
        .finalize();
    let mut hex = [0u8; 16];
    for (i, b) in digest[..8].iter().enumerate() {
        hex[2 * i] = HEX[usize::from(b >> 4)];
        hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    hex
}

/// `<tenant>.<signature>`: enough to show a tenant taken from a verified
/// credential.
pub fn sign(tenant: &str) -> String {
    format!("{tenant}.{}", String::from_utf8_lossy(&signature(tenant)))
}

/// The claims of a valid `<tenant>.<signature>` token.
fn verify(token: &str) -> Option<Claims> {
    let (tenant, signed) = token.rsplit_once('.')?;
    (signed.as_bytes() == signature(tenant)).then(|| Claims {
        namespace_id: tenant.to_owned(),
    })
}

/// Authentication: a valid bearer token puts its [`Claims`] in the request.
pub async fn authenticate(mut req: Request, next: Next) -> Response {
    let claims = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(verify);
    match claims {
        Some(claims) => {
            req.extensions_mut().insert(claims);
            next.run(req).await
        }
        None => (StatusCode::UNAUTHORIZED, "bad or missing bearer token\n").into_response(),
    }
}

/// Reads the payload whole and answers whether it was queued.
pub async fn receive_webhook(body: Body) -> Response {
    // A real receiver would put the payload on a queue here; one it could
    // not read whole (over 1 MiB, or the upload cut off) is not queued.
    match axum::body::to_bytes(body, 1 << 20).await {
        Ok(_payload) => (StatusCode::ACCEPTED, "queued\n").into_response(),
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                (StatusCode::PAYLOAD_TOO_LARGE, "not queued: over 1 MiB\n").into_response()
            } else {
                (StatusCode::BAD_REQUEST, "not queued: body cut off\n").into_response()
            }
        }
    }
}

/// The flags both servers take; each binary's own flags land in `own`.
#[derive(Debug)]
pub struct Flags {
    pub port: u16,
    pub rps: u64,
    pub concurrency: u32,
    pub tenant_rpm: u64,
    pub print_token: Option<String>,
    pub help: bool,
    /// `(flag, value)` for each flag of `own_flags` given.
    pub own: Vec<(String, String)>,
}

impl Flags {
    /// The value of the binary's own `flag`, if given.
    pub fn own(&self, flag: &str) -> Option<&str> {
        self.own
            .iter()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }
}

/// The usage lines of the shared flags.
pub const SHARED_USAGE: &str = "  --port N             port on 127.0.0.1 (3000; 0 picks a free one)
  --rps N              the webhook route's requests per second (100)
  --concurrency N      its concurrent requests (200; 0: no concurrency limit)
  --tenant-rpm N       each tenant's requests per minute (6000)
  --print-token TENANT print a bearer token for TENANT and exit
  --help               this text
";

/// Parses the command line: the shared flags, and `own_flags` (each takes a value).
pub fn parse_flags(own_flags: &[&str]) -> Result<Flags, String> {
    let mut flags = Flags {
        port: 3000,
        rps: 100,
        concurrency: 200,
        tenant_rpm: 6000,
        print_token: None,
        help: false,
        own: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--port" => flags.port = number(value()?)?.try_into().map_err(|_| "bad --port")?,
            "--rps" => flags.rps = number(value()?)?,
            "--concurrency" => {
                flags.concurrency = number(value()?)?
                    .try_into()
                    .map_err(|_| "bad --concurrency")?
            }
            "--tenant-rpm" => flags.tenant_rpm = number(value()?)?,
            "--print-token" => flags.print_token = Some(value()?),
            "--help" | "-h" => flags.help = true,
            own if own_flags.contains(&own) => {
                let v = value()?;
                flags.own.push((flag, v));
            }
            other => return Err(format!("unknown flag {other} (--help lists them)")),
        }
    }
    Ok(flags)
}

/// The pressure config the flags describe: the webhook route and each tenant.
pub fn flags_config(flags: &Flags) -> Result<PressureConfig, String> {
    let concurrency = match flags.concurrency {
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
        rps = flags.rps,
        rpm = flags.tenant_rpm
    );
    PressureConfig::from_json("flags", &json).map_err(|e| e.to_string())
}

/// The webhook route, with no limiter.
pub fn webhooks() -> Router {
    Router::new().route("/api/v1/webhooks/{source}", post(receive_webhook))
}

/// The webhook route under `pressure`: the route stage before
/// authentication, the tenant stage after it, in one `Router::layer` (axum
/// boxes and clones each layer it is given per request).
pub fn pressured_webhooks(pressure: &Pressure) -> Router {
    webhooks().layer(
        ServiceBuilder::new()
            .layer(pressure.layer())
            .layer(middleware::from_fn(authenticate))
            .layer(pressure.tenant_layer(FromExtension::new(|c: &Claims| c.namespace_id.as_str()))),
    )
}

/// Serves `app` on 127.0.0.1:`port` until Ctrl-C or SIGTERM, as `name`
/// (`what` ends the line that says where it listens).
pub async fn serve(name: &str, port: u16, app: Router, what: &str) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("{name} listening on http://{addr} ({what})");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| e.to_string())?;
    println!("{name} stopped");
    Ok(())
}

/// Ctrl-C, or SIGTERM on unix.
async fn shutdown_signal() {
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
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

/// Parses the flags, answers `--help` and `--print-token`; the flags to
/// serve with otherwise. Exits 2 on a bad flag.
pub fn flags_or_exit(name: &str, usage: &str, own_flags: &[&str]) -> Option<Flags> {
    let flags = match parse_flags(own_flags) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    };
    if flags.help {
        print!("usage: {name} [flags]\n{usage}{SHARED_USAGE}");
        return None;
    }
    if let Some(tenant) = &flags.print_token {
        println!("{}", sign(tenant));
        return None;
    }
    Some(flags)
}
