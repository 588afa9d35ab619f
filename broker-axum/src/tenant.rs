//! Who a request is for: the [`TenantExtractor`] trait, the ready-made
//! [`FromExtension`] (e.g. a claim of a verified JWT put in the request's
//! extensions by the auth layer) and [`FromHeader`], and [`tenant_key`],
//! which turns any tenant id (user data) into a bounded, safe sub-key.

use std::borrow::Cow;
use std::marker::PhantomData;

use http::{Extensions, HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use crate::fields::field;

/// Longest tenant id used as is; longer ones are hashed.
pub const MAX_TENANT_LEN: usize = 64;

/// Finds the tenant of a request, after authentication.
///
/// Return `None` for a request without a tenant: the tenant stage lets it
/// pass (the route and service limits still apply).
///
/// ```
/// use std::borrow::Cow;
/// use broker_axum::TenantExtractor;
/// use http::{Extensions, HeaderMap};
///
/// #[derive(Clone)]
/// struct Claims { namespace_id: String }
///
/// #[derive(Clone)]
/// struct Namespace;
/// impl TenantExtractor for Namespace {
///     fn tenant<'a>(&self, _: &'a HeaderMap, ext: &'a Extensions) -> Option<Cow<'a, str>> {
///         ext.get::<Claims>().map(|c| Cow::Borrowed(c.namespace_id.as_str()))
///     }
/// }
/// ```
pub trait TenantExtractor: Clone + Send + Sync + 'static {
    /// The tenant id of a request with these headers and extensions.
    fn tenant<'a>(
        &self,
        headers: &'a HeaderMap,
        extensions: &'a Extensions,
    ) -> Option<Cow<'a, str>>;
}

/// The tenant is a value of type `T` in the request's extensions (put there
/// by the auth layer), read through a function.
///
/// ```
/// use broker_axum::FromExtension;
/// #[derive(Clone)]
/// struct Claims { namespace_id: String }
/// let by_namespace = FromExtension::new(|c: &Claims| c.namespace_id.as_str());
/// # let _ = by_namespace;
/// ```
pub struct FromExtension<T, F> {
    read: F,
    _t: PhantomData<fn(&T)>,
}

impl<T, F: Clone> Clone for FromExtension<T, F> {
    fn clone(&self) -> Self {
        Self {
            read: self.read.clone(),
            _t: PhantomData,
        }
    }
}

impl<T, F> std::fmt::Debug for FromExtension<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromExtension")
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T, F> FromExtension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> &str + Clone + Send + Sync + 'static,
{
    /// Reads the tenant id from the extension of type `T` with `read`.
    pub fn new(read: F) -> Self {
        Self {
            read,
            _t: PhantomData,
        }
    }
}

impl<T, F> TenantExtractor for FromExtension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> &str + Clone + Send + Sync + 'static,
{
    fn tenant<'a>(&self, _: &'a HeaderMap, extensions: &'a Extensions) -> Option<Cow<'a, str>> {
        extensions.get::<T>().map(|t| Cow::Borrowed((self.read)(t)))
    }
}

/// The tenant is the value of a request header (only sound behind a proxy
/// that sets it, since clients can send anything). A value that is not
/// visible ASCII is reduced to a fingerprint of its bytes, marked with a
/// character no such header value can hold (`U+FFFD`), so that no other
/// value reaches its state; a missing header means no tenant.
///
/// ```
/// use broker_axum::FromHeader;
/// let by_header = FromHeader::new(http::HeaderName::from_static("x-tenant-id"));
/// # let _ = by_header;
/// ```
#[derive(Debug, Clone)]
pub struct FromHeader {
    name: HeaderName,
}

impl FromHeader {
    /// Reads the tenant id from header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl TenantExtractor for FromHeader {
    fn tenant<'a>(&self, headers: &'a HeaderMap, _: &'a Extensions) -> Option<Cow<'a, str>> {
        let value = field(headers, &self.name)?;
        Some(match value.to_str() {
            Ok(s) => Cow::Borrowed(s),
            // `to_str` takes visible ASCII only: the mark keeps the
            // fingerprint apart from a client sending its text.
            Err(_) => Cow::Owned(format!("\u{FFFD}{}", hashed(value.as_bytes()))),
        })
    }
}

/// The bytes a tenant id is kept with, as a table (one load per byte).
static ALLOWED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'@' | b'+');
        b += 1;
    }
    table
};

#[inline]
fn allowed(b: u8) -> bool {
    ALLOWED[usize::from(b)]
}

/// Length of the hashed form: `~` and 32 hex digits.
const HASHED_LEN: usize = 33;

fn hashed_into(bytes: &[u8], out: &mut [u8; MAX_TENANT_LEN]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    out[0] = b'~';
    for (i, b) in digest[..16].iter().enumerate() {
        out[1 + 2 * i] = HEX[usize::from(b >> 4)];
        out[2 + 2 * i] = HEX[usize::from(b & 0xf)];
    }
}

fn hashed(bytes: &[u8]) -> String {
    let mut buf = [0u8; MAX_TENANT_LEN];
    hashed_into(bytes, &mut buf);
    String::from_utf8_lossy(&buf[..HASHED_LEN]).into_owned()
}

#[inline]
fn kept(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_TENANT_LEN && id.bytes().all(allowed)
}

/// [`tenant_key`] held inline (no allocation per request).
#[derive(Clone, Copy)]
pub(crate) struct TenantId {
    len: u8,
    buf: [u8; MAX_TENANT_LEN],
}

impl TenantId {
    /// The key of tenant id `raw`, as [`tenant_key`] makes it.
    pub(crate) fn new(raw: &str) -> Self {
        let mut buf = [0u8; MAX_TENANT_LEN];
        let len = if kept(raw) {
            buf[..raw.len()].copy_from_slice(raw.as_bytes());
            raw.len()
        } else {
            hashed_into(raw.as_bytes(), &mut buf);
            HASHED_LEN
        };
        Self {
            len: len as u8,
            buf,
        }
    }

    /// The key.
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII is ever written, so this never falls back.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }
}

/// The sub-key a tenant id is stored under: the id itself when it is
/// 1..=[`MAX_TENANT_LEN`] bytes of `[A-Za-z0-9._@+-]`, else `~` and a
/// 128-bit SHA-256 prefix of its bytes (`~` never occurs in a kept id, so
/// the two forms cannot collide). Bounded in size, safe in keys and logs,
/// and total: no input panics.
///
/// ```
/// use broker_axum::tenant_key;
/// assert_eq!(tenant_key("acme-42"), "acme-42");
/// let odd = tenant_key("a:b{c}\n");
/// assert!(odd.starts_with('~') && odd.len() == 33);
/// assert_eq!(tenant_key(&"x".repeat(10_000)).len(), 33);
/// ```
#[inline]
pub fn tenant_key(id: &str) -> Cow<'_, str> {
    if kept(id) {
        Cow::Borrowed(id)
    } else {
        Cow::Owned(hashed(id.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_odd_ids_get_distinct_keys() {
        assert_ne!(tenant_key("a b"), tenant_key("a  b"));
        assert_ne!(tenant_key(""), tenant_key(" "));
    }

    #[test]
    fn kept_and_hashed_forms_cannot_collide() {
        let hashed = tenant_key("not allowed!").into_owned();
        assert_eq!(tenant_key(&hashed), tenant_key(&hashed));
        assert_ne!(tenant_key(&hashed).as_ref(), hashed.as_str());
    }

    #[test]
    fn inline_id_equals_tenant_key() {
        for id in [
            "acme",
            "",
            "a:b",
            &"z".repeat(64),
            &"z".repeat(65),
            "\u{e9}t\u{e9}",
        ] {
            assert_eq!(TenantId::new(id).as_str(), tenant_key(id), "{id:?}");
        }
    }

    #[test]
    fn non_utf8_header_value_is_fingerprinted() {
        let mut headers = HeaderMap::new();
        let name = HeaderName::from_static("x-tenant");
        headers.insert(
            name.clone(),
            http::HeaderValue::from_bytes(&[0xff, 0xfe, b'a']).unwrap(),
        );
        let extensions = Extensions::new();
        let t = FromHeader::new(name).tenant(&headers, &extensions).unwrap();
        assert!(t.starts_with('\u{FFFD}'));
        assert_eq!(tenant_key(&t).len(), 33);
    }

    /// A client that sends, as text, what a value that is not visible
    /// ASCII is reduced to does not reach that value's state.
    #[test]
    fn the_text_of_a_fingerprint_is_another_tenant() {
        let name = HeaderName::from_static("x-tenant");
        let extract = FromHeader::new(name.clone());
        let key_of = |value: http::HeaderValue| {
            let mut headers = HeaderMap::new();
            headers.insert(name.clone(), value);
            let extensions = Extensions::new();
            tenant_key(&extract.tenant(&headers, &extensions).unwrap()).into_owned()
        };
        let bytes = [0xff, 0xfe, b'a'];
        let odd = key_of(http::HeaderValue::from_bytes(&bytes).unwrap());
        for text in [hashed(&bytes), odd.clone()] {
            let sent = key_of(http::HeaderValue::from_str(&text).unwrap());
            assert_ne!(sent, odd, "{text} reaches the state of {bytes:?}");
        }
    }
}
