//! What an acquisition addresses: a registered resource, optionally one
//! sub-key of it (a tenant, a route, a credential fingerprint).

/// A registered resource, or one sub-key of it. Sub-keys share the
/// resource's limits but each has its own state, created on first use and
/// evicted when idle.
///
/// ```
/// use broker_core::Target;
/// let whole: Target = "webhooks".into();
/// let tenant: Target = ("tenants", "acme").into();
/// assert_eq!(whole.key, None);
/// assert_eq!(tenant.key, Some("acme"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// The registered resource id.
    pub resource: &'a str,
    /// The sub-key, if any.
    pub key: Option<&'a str>,
}

impl<'a> From<&'a str> for Target<'a> {
    fn from(resource: &'a str) -> Self {
        Self {
            resource,
            key: None,
        }
    }
}

impl<'a> From<&'a String> for Target<'a> {
    fn from(resource: &'a String) -> Self {
        Self {
            resource,
            key: None,
        }
    }
}

impl<'a> From<(&'a str, &'a str)> for Target<'a> {
    fn from((resource, key): (&'a str, &'a str)) -> Self {
        Self {
            resource,
            key: Some(key),
        }
    }
}
