//! Who a request is for: [`TenantExtractor`], with [`FromExtension`] and
//! [`FromHeader`] ready-made.

use std::borrow::Cow;
use std::marker::PhantomData;

use http::{Extensions, HeaderMap, HeaderName};

/// A tenant id: text, or bytes that are not UTF-8; the two never share keys.
///
/// ```
/// use broker_axum::Tenant;
/// assert_eq!(Tenant::from("acme"), Tenant::Text("acme".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenant<'a> {
    /// A text id (a claim, a UTF-8 header value).
    Text(Cow<'a, str>),
    /// The bytes of a value that is not UTF-8.
    Bytes(Cow<'a, [u8]>),
}

impl<'a, T: Into<Cow<'a, str>>> From<T> for Tenant<'a> {
    fn from(id: T) -> Self {
        Tenant::Text(id.into())
    }
}

/// Finds the tenant of a request, after authentication; `None` passes the
/// tenant stage.
///
/// ```
/// use broker_axum::{Tenant, TenantExtractor};
/// use http::{Extensions, HeaderMap};
///
/// #[derive(Clone)]
/// struct Claims { namespace_id: String }
///
/// #[derive(Clone)]
/// struct Namespace;
/// impl TenantExtractor for Namespace {
///     fn tenant<'a>(&self, _: &'a HeaderMap, ext: &'a Extensions) -> Option<Tenant<'a>> {
///         ext.get::<Claims>().map(|c| c.namespace_id.as_str().into())
///     }
/// }
/// ```
pub trait TenantExtractor: Clone + Send + Sync + 'static {
    /// The tenant of a request with these headers and extensions.
    fn tenant<'a>(&self, headers: &'a HeaderMap, extensions: &'a Extensions) -> Option<Tenant<'a>>;
}

/// The tenant is read from a `T` in the request's extensions (set by auth;
/// extensions are `Clone`).
///
/// ```
/// use broker_axum::FromExtension;
/// #[derive(Clone)]
/// struct Claims { namespace_id: String }
/// let by_namespace = FromExtension::new(|c: &Claims| c.namespace_id.as_str());
/// # let _ = by_namespace;
/// ```
#[derive(Clone)]
pub struct FromExtension<T, F> {
    read: F,
    _t: PhantomData<fn(&T)>,
}

impl<T, F> std::fmt::Debug for FromExtension<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromExtension")
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T, F: Fn(&T) -> &str> FromExtension<T, F> {
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
    T: Clone + Send + Sync + 'static,
    F: Fn(&T) -> &str + Clone + Send + Sync + 'static,
{
    fn tenant<'a>(&self, _: &'a HeaderMap, extensions: &'a Extensions) -> Option<Tenant<'a>> {
        extensions.get::<T>().map(|t| Tenant::from((self.read)(t)))
    }
}

/// The tenant is a request header's value (sound only behind a proxy that
/// sets it); none when missing.
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
    fn tenant<'a>(&self, headers: &'a HeaderMap, _: &'a Extensions) -> Option<Tenant<'a>> {
        let bytes = headers.get(&self.name)?.as_bytes();
        Some(std::str::from_utf8(bytes).map_or_else(|_| Tenant::Bytes(bytes.into()), Tenant::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_value_is_text_when_utf8_else_bytes() {
        let name = HeaderName::from_static("x-tenant");
        let extract = FromHeader::new(name.clone());
        let tenant_of = |value: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(name.clone(), http::HeaderValue::from_bytes(value).unwrap());
            extract
                .tenant(&headers, &Extensions::new())
                .map(|t| match t {
                    Tenant::Text(t) => Tenant::Text(Cow::Owned(t.into_owned())),
                    Tenant::Bytes(b) => Tenant::Bytes(Cow::Owned(b.into_owned())),
                })
                .unwrap()
        };
        assert_eq!(tenant_of(b"acme"), Tenant::from("acme"));
        assert_eq!(tenant_of("caf\u{e9}".as_bytes()), Tenant::from("caf\u{e9}"));
        let odd: &[u8] = &[0xff, 0xfe, b'a'];
        assert_eq!(tenant_of(odd), Tenant::Bytes(odd.to_vec().into()));
        assert!(extract
            .tenant(&HeaderMap::new(), &Extensions::new())
            .is_none());
    }
}
