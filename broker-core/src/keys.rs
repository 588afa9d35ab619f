//! Keys built from user data. Every user-supplied part is escaped, so one id
//! can never address another's state, and secrets are reduced to a
//! fingerprint before they come near a key or a log line.

use std::borrow::Cow;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

/// Characters with a meaning in keys: the separator `:`, Redis hash-tag
/// braces, the escape character itself, and anything non-printable.
const fn escaped(b: u8) -> bool {
    matches!(b, b':' | b'{' | b'}' | b'%' | b'\\') || b < 0x21 || b >= 0x7f
}

/// [`escaped`] for every byte, looked up on the hot path.
const NEEDS_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = escaped(b as u8);
        b += 1;
    }
    table
};

fn needs_escape(b: u8) -> bool {
    NEEDS_ESCAPE[b as usize]
}

/// Escapes one user-supplied part of a key (percent-encoding of the special
/// bytes). Two different inputs never escape to the same output.
///
/// ```
/// use broker_core::keys::escape;
/// assert_eq!(escape("tenant-1"), "tenant-1");
/// assert_eq!(escape("a:b{c}"), "a%3Ab%7Bc%7D");
/// ```
pub fn escape(part: &str) -> Cow<'_, str> {
    if !part.bytes().any(needs_escape) {
        return Cow::Borrowed(part);
    }
    let mut out = String::with_capacity(part.len() + 8);
    for &b in part.as_bytes() {
        if needs_escape(b) {
            let _ = write!(out, "%{b:02X}");
        } else {
            out.push(b as char);
        }
    }
    Cow::Owned(out)
}

/// The state key of a resource.
pub fn resource_key(resource: &str) -> String {
    escape(resource).into_owned()
}

/// The state key of one sub-key (tenant, route, credential) of a resource:
/// `escape(resource):escape(key)`.
///
/// ```
/// use broker_core::keys::keyed;
/// assert_ne!(keyed("a:b", "c"), keyed("a", "b:c"));
/// ```
pub fn keyed(resource: &str, key: &str) -> String {
    let r = escape(resource);
    let k = escape(key);
    let mut out = String::with_capacity(r.len() + k.len() + 1);
    out.push_str(&r);
    out.push(':');
    out.push_str(&k);
    out
}

/// A non-reversible fingerprint of a secret (token, password, API key):
/// the first 16 hex digits of its SHA-256. Use it wherever a credential
/// must tell keys apart; the secret itself never enters a key or a log.
///
/// ```
/// use broker_core::keys::fingerprint;
/// let fp = fingerprint("sk-live-123");
/// assert_eq!(fp.len(), 16);
/// assert!(!fp.contains("sk-live"));
/// ```
pub fn fingerprint(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    let mut out = String::with_capacity(16);
    for b in &digest[..8] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_injective_on_separators() {
        assert_ne!(keyed("a", "b:c"), keyed("a:b", "c"));
        assert_ne!(escape("%3A"), escape(":"));
        assert_eq!(escape("{x}"), "%7Bx%7D");
        assert_eq!(escape("a b\n"), "a%20b%0A");
    }
}
