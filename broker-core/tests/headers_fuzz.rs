//! The header parser never panics and never reports a value out of range,
//! whatever bytes arrive.

use std::time::{Duration, UNIX_EPOCH};

use broker_core::headers;
use broker_core::limits::{MAX_AMOUNT, MAX_PERIOD};
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

const NAMES: &[&str] = &[
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-retry",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "retry-after",
];

fn in_range(o: &broker_core::Observed) -> bool {
    o.limit.is_none_or(|n| n <= MAX_AMOUNT)
        && o.remaining.is_none_or(|n| n <= MAX_AMOUNT)
        && o.reset.is_none_or(|d| d <= MAX_PERIOD)
}

/// Bytes that look like header values: digits, signs, dots, units, quotes,
/// separators, and arbitrary bytes mixed in.
fn value_bytes() -> impl Strategy<Value = Vec<u8>> {
    let alphabet = prop::sample::select(
        b"0123456789-+.,;=\" hmsu\xc2\xb5ntrqwlimitGMTWedOct:\t\x7f\xff\x80".to_vec(),
    );
    prop_oneof![
        prop::collection::vec(alphabet, 0..40),
        prop::collection::vec(any::<u8>(), 0..40),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic_and_stay_in_range(
        values in prop::collection::vec((0..NAMES.len(), value_bytes()), 0..8),
        now_secs in 0u64..4_000_000_000,
    ) {
        let mut map = HeaderMap::new();
        for (i, bytes) in values {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                map.append(HeaderName::from_static(NAMES[i]), v);
            }
        }
        let seen = headers::parse(&map, UNIX_EPOCH + Duration::from_secs(now_secs));
        prop_assert!(seen.requests.as_ref().is_none_or(in_range));
        prop_assert!(seen.tokens.as_ref().is_none_or(in_range));
        prop_assert!(seen.retry_after.is_none_or(|d| d <= MAX_PERIOD));
    }

    #[test]
    fn well_formed_counts_round_trip(limit in 0u64..=MAX_AMOUNT, remaining in 0u64..=MAX_AMOUNT, reset in 0u64..31_000_000) {
        let mut map = HeaderMap::new();
        map.insert("x-ratelimit-limit", limit.into());
        map.insert("x-ratelimit-remaining", remaining.into());
        map.insert("x-ratelimit-reset", reset.into());
        let seen = headers::parse(&map, UNIX_EPOCH);
        let r = seen.requests.unwrap();
        prop_assert_eq!(r.limit, Some(limit));
        prop_assert_eq!(r.remaining, Some(remaining));
        prop_assert_eq!(r.reset, Some(Duration::from_secs(reset)));
    }
}

/// OpenAI's reset fields are Go durations, whose microseconds are written
/// `µs` (not ASCII): such a field is read, not dropped.
#[test]
fn a_reset_in_microseconds_written_with_the_micro_sign_is_read() {
    let mut h = HeaderMap::new();
    h.insert(
        "x-ratelimit-reset-requests",
        HeaderValue::from_bytes("500µs".as_bytes()).unwrap(),
    );
    h.insert(
        "x-ratelimit-remaining-requests",
        HeaderValue::from_static("0"),
    );
    let seen = headers::parse(&h, UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let requests = seen.requests.expect("the requests fields are read");
    assert_eq!(requests.reset, Some(Duration::from_micros(500)));
}
