//! Finding a field in a header map: a message has few fields, so the
//! layers scan the names (a standard name compares as a small tag, a
//! custom one by length first) instead of hashing the name, up to
//! [`SCAN_FIELDS`] distinct names; longer maps get the hashed lookup.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The first value of the field `name`.
#[inline]
pub(crate) fn field<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if headers.keys_len() <= SCAN_FIELDS {
        headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    } else {
        headers.get(name)
    }
}

/// Up to this many distinct field names, [`field`] scans.
const SCAN_FIELDS: usize = 8;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::header;

    /// A map with `n` other fields, then `name: value` if given.
    pub(crate) fn map(n: usize, extra: Option<(HeaderName, &'static str)>) -> HeaderMap {
        let mut h = HeaderMap::new();
        for i in 0..n {
            h.insert(
                HeaderName::try_from(format!("x-field-{i}")).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        if let Some((name, value)) = extra {
            h.append(name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn short_and_long_maps_find_the_same_fields() {
        for n in [0, 3, SCAN_FIELDS - 1, SCAN_FIELDS, SCAN_FIELDS + 1, 40] {
            let with = map(n, Some((header::UPGRADE, "websocket")));
            assert!(field(&with, &header::UPGRADE).is_some(), "{n} fields");
            assert!(
                field(&map(n, None), &header::UPGRADE).is_none(),
                "{n} fields"
            );
            let ct = map(n, Some((header::CONTENT_TYPE, "text/event-stream")));
            assert_eq!(
                field(&ct, &header::CONTENT_TYPE).map(HeaderValue::as_bytes),
                Some(&b"text/event-stream"[..]),
                "{n} fields"
            );
            assert_eq!(field(&ct, &header::UPGRADE), None, "{n} fields");
        }
    }

    #[test]
    fn field_is_the_first_value_of_a_repeated_name() {
        let mut h = map(2, Some((header::CONTENT_TYPE, "text/event-stream")));
        h.append(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(
            field(&h, &header::CONTENT_TYPE).map(HeaderValue::as_bytes),
            Some(&b"text/event-stream"[..])
        );
    }

    #[test]
    fn custom_names_are_found_by_scan_and_by_lookup() {
        let name = HeaderName::from_static("x-tenant");
        for n in [0, 5, 30] {
            let h = map(n, Some((name.clone(), "acme")));
            assert_eq!(
                field(&h, &name).map(HeaderValue::as_bytes),
                Some(&b"acme"[..])
            );
            let other = HeaderName::from_static("x-tenanu");
            assert_eq!(field(&h, &other), None, "{n} fields");
        }
    }
}
