//! The webhook route the example serves (and the load bench serves too,
//! under every layer it compares): a bearer token "signed" for a tenant,
//! authentication that puts its claims in the request, and the receiver.

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

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
