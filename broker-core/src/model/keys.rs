//! Keys built from user data: every part is escaped, so no id addresses
//! another's state; secrets become a fingerprint.

use std::borrow::Cow;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use sha2::{Digest, Sha256};

/// Bytes with a meaning in keys: `:`, hash-tag braces, escapes, non-printables
/// (non-ASCII bytes are always escaped).
pub(crate) const SPECIAL: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b':')
    .add(b'{')
    .add(b'}')
    .add(b'%')
    .add(b'\\');

/// Percent-encodes the special bytes of one part of a key; one to one.
///
/// ```
/// use broker_core::keys::escape;
/// assert_eq!(escape("tenant-1"), "tenant-1");
/// assert_eq!(escape("a:b{c}"), "a%3Ab%7Bc%7D");
/// ```
pub fn escape(part: &str) -> Cow<'_, str> {
    utf8_percent_encode(part, SPECIAL).into()
}

/// The input [`escape`] turns into `escaped`, or `None` if there is none.
///
/// ```
/// use broker_core::keys::{escape, unescape};
/// assert_eq!(unescape("tenant-1").as_deref(), Some("tenant-1"));
/// assert_eq!(unescape(&escape("a:b{c}")).as_deref(), Some("a:b{c}"));
/// assert_eq!(unescape("a:b"), None); // escape never leaves a `:`
/// assert_eq!(unescape("%41"), None); // nor escapes an `A`
/// ```
pub fn unescape(escaped: &str) -> Option<Cow<'_, str>> {
    if !escaped.contains('%') {
        // The common case: nothing escaped, so valid iff nothing needs it.
        return (escape(escaped) == escaped).then_some(Cow::Borrowed(escaped));
    }
    let raw = percent_decode_str(escaped).decode_utf8().ok()?;
    // Canonical only: `raw` escapes back to `escaped` (compared without allocating).
    let mut rest = escaped;
    let canonical = utf8_percent_encode(&raw, SPECIAL)
        .all(|chunk| rest.strip_prefix(chunk).map(|r| rest = r).is_some());
    (canonical && rest.is_empty()).then_some(raw)
}

/// The state key of one sub-key of a resource: `escape(resource):escape(key)`.
///
/// ```
/// use broker_core::keys::keyed;
/// assert_ne!(keyed("a:b", "c"), keyed("a", "b:c"));
/// ```
pub fn keyed(resource: &str, key: &str) -> String {
    format!("{}:{}", escape(resource), escape(key))
}

/// A fingerprint of a secret: the first 16 hex digits of its SHA-256.
///
/// ```
/// use broker_core::keys::fingerprint;
/// let fp = fingerprint("sk-live-123");
/// assert_eq!(fp.len(), 16);
/// assert!(!fp.contains("sk-live"));
/// ```
pub fn fingerprint(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
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

    proptest::proptest! {
        #[test]
        fn unescape_inverts_escape(part in "\\PC*|[a-z:{}%\\\\ \n\u{7f}\u{e9}]{0,12}") {
            let escaped = escape(&part);
            let back = unescape(&escaped).map(Cow::into_owned);
            proptest::prop_assert_eq!(back, Some(part));
        }

        /// One to one: whatever unescapes escapes back to itself.
        #[test]
        fn only_escape_outputs_unescape(text in "[a%0-9A-Fa-f:{}\\\\ ]{0,12}") {
            if let Some(raw) = unescape(&text) {
                let again = escape(&raw).into_owned();
                proptest::prop_assert_eq!(again, text);
            }
        }
    }

    #[test]
    fn non_canonical_escapes_do_not_unescape() {
        for text in [
            "%3a", "%41", "%+F", "%3", "%", "a%2", "%C3", "%FF", "a:b", "a b",
        ] {
            assert_eq!(unescape(text), None, "{text}");
        }
        assert_eq!(unescape("%C3%A9").as_deref(), Some("\u{e9}"));
        assert_eq!(unescape("").as_deref(), Some(""));
    }
}
