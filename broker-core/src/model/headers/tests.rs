//! Tests of [`super`].

use super::*;
use http::HeaderValue;

fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn x_ratelimit_family_with_retry_on_429() {
    let seen = parse(
        &map(&[
            ("X-Ratelimit-Limit", "300"),
            ("X-Ratelimit-Remaining", "0"),
            ("X-Ratelimit-Reset", "7"),
            ("X-Ratelimit-Retry", "3"),
        ]),
        at(0),
    );
    assert_eq!(
        seen.requests,
        Some(Observed {
            limit: Some(300),
            remaining: Some(0),
            reset: Some(Duration::from_secs(7)),
            ..Observed::default()
        })
    );
    assert_eq!(seen.retry_after, Some(Duration::from_secs(3)));
}

#[test]
fn reset_given_as_unix_time_becomes_a_delay() {
    let now = 1_700_000_000;
    let seen = parse(
        &map(&[
            ("x-ratelimit-remaining", "10"),
            ("x-ratelimit-reset", "1700000042"),
        ]),
        at(now),
    );
    assert_eq!(seen.requests.unwrap().reset, Some(Duration::from_secs(42)));
}

/// A Unix time with a fraction (Discord's `X-RateLimit-Reset:
/// 1470173023.123`) is a Unix time still, not a malformed value: a
/// spent counter keeps its reset.
#[test]
fn a_reset_given_as_a_fractional_unix_time_becomes_a_delay() {
    let seen = parse(
        &map(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1700000042.250"),
        ]),
        at(1_700_000_000),
    );
    assert_eq!(
        seen.requests.unwrap().reset,
        Some(Duration::from_millis(42_250))
    );
}

/// Two exhausted windows: the longer penalty is the one the upstream
/// enforces, in one field and across header families.
#[test]
fn of_two_exhausted_counters_the_later_reset_is_kept() {
    let one_field = parse(
        &map(&[("RateLimit", r#""burst";r=0;t=1, "daily";r=0;t=3600"#)]),
        at(0),
    );
    let families = parse(
        &map(&[
            ("X-Ratelimit-Remaining", "0"),
            ("X-Ratelimit-Reset", "1"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "3600"),
        ]),
        at(0),
    );
    for seen in [one_field, families] {
        assert_eq!(
            seen.requests.as_ref().and_then(|o| o.reset),
            Some(Duration::from_secs(3600)),
            "{seen:?}"
        );
    }
}

#[test]
fn ietf_structured_fields_pick_the_tightest_policy() {
    let seen = parse(
        &map(&[
            (
                "RateLimit-Policy",
                r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
            ),
            ("RateLimit", r#""burst";r=40;t=30, "daily";r=7;t=3600"#),
        ]),
        at(0),
    );
    assert_eq!(
        seen.requests,
        Some(Observed {
            limit: Some(1000),
            remaining: Some(7),
            reset: Some(Duration::from_secs(3600)),
            window: Some(Duration::from_secs(86_400)),
            policy: Some("daily".into()),
        })
    );
}

/// The IETF policy's window (`w`) and name stay with its counter, a
/// policy sent alone included: they say which configured limit the
/// counter speaks of.
#[test]
fn an_ietf_policy_keeps_its_window_and_name() {
    let alone = parse(
        &map(&[("RateLimit-Policy", r#""default";q=100;w=60"#)]),
        at(0),
    );
    assert_eq!(
        alone.requests,
        Some(Observed {
            limit: Some(100),
            window: Some(Duration::from_secs(60)),
            policy: Some("default".into()),
            ..Observed::default()
        })
    );
    let counted = parse(
        &map(&[
            ("RateLimit-Policy", r#""default";q=100;w=60"#),
            ("RateLimit", r#""default";r=0;t=12"#),
        ]),
        at(0),
    );
    let requests = counted.requests.unwrap();
    assert_eq!(requests.window, Some(Duration::from_secs(60)));
    assert_eq!(requests.policy.as_deref(), Some("default"));
    assert_eq!(requests.remaining, Some(0));
    // Beside the separate fields of an older draft.
    let separate = parse(
        &map(&[
            ("RateLimit-Policy", r#""minute";q=100;w=60"#),
            ("RateLimit-Remaining", "3"),
        ]),
        at(0),
    );
    let requests = separate.requests.unwrap();
    assert_eq!(requests.window, Some(Duration::from_secs(60)));
    assert_eq!(requests.policy.as_deref(), Some("minute"));
    assert_eq!(requests.remaining, Some(3));
}

/// A quote left open on one line of a list field spoils that line
/// only: the spent policy on the next line is still read.
#[test]
fn a_quote_left_open_on_one_line_spoils_that_line_only() {
    let seen = parse(
        &map(&[
            ("RateLimit", r#""burst;r=40;t=30"#),
            ("RateLimit", r#""daily";r=0;t=3600"#),
        ]),
        at(0),
    );
    let requests = seen.requests.unwrap();
    assert_eq!(requests.remaining, Some(0));
    assert_eq!(requests.reset, Some(Duration::from_secs(3600)));
}

/// `RateLimit` and `RateLimit-Policy` are lists (structured fields),
/// which a server or a proxy on the way may send as several lines:
/// every line is read, so a spent policy on the second line is not lost
/// behind a roomy one on the first.
#[test]
fn a_list_field_sent_as_several_lines_is_read_whole() {
    let seen = parse(
        &map(&[
            ("RateLimit-Policy", r#""burst";q=100;w=60"#),
            ("RateLimit-Policy", r#""daily";q=1000;w=86400"#),
            ("RateLimit", r#""burst";r=40;t=30"#),
            ("RateLimit", r#""daily";r=0;t=3600"#),
        ]),
        at(0),
    );
    assert_eq!(
        seen.requests,
        Some(Observed {
            limit: Some(1000),
            remaining: Some(0),
            reset: Some(Duration::from_secs(3600)),
            window: Some(Duration::from_secs(86_400)),
            policy: Some("daily".into()),
        })
    );
}

#[test]
fn older_ietf_drafts_both_forms() {
    let separate = parse(
        &map(&[
            ("RateLimit-Limit", "100"),
            ("RateLimit-Remaining", "5"),
            ("RateLimit-Reset", "9"),
        ]),
        at(0),
    );
    let combined = parse(
        &map(&[("RateLimit", "limit=100, remaining=5, reset=9")]),
        at(0),
    );
    let expected = Some(Observed {
        limit: Some(100),
        remaining: Some(5),
        reset: Some(Duration::from_secs(9)),
        ..Observed::default()
    });
    assert_eq!(separate.requests, expected);
    assert_eq!(combined.requests, expected);
}

#[test]
fn openai_requests_and_tokens_with_go_durations() {
    let seen = parse(
        &map(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "29000"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]),
        at(0),
    );
    assert_eq!(
        seen.requests.unwrap().reset,
        Some(Duration::from_millis(120))
    );
    assert_eq!(
        seen.tokens,
        Some(Observed {
            limit: Some(30000),
            remaining: Some(29000),
            reset: Some(Duration::from_secs(360)),
            ..Observed::default()
        })
    );
}

#[test]
fn retry_after_date_and_seconds_take_the_longer() {
    let now = at(1_445_412_470);
    let seen = parse(
        &map(&[
            ("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT"),
            ("X-Ratelimit-Retry", "4"),
        ]),
        now,
    );
    assert_eq!(seen.retry_after, Some(Duration::from_secs(10)));
    let past = parse(
        &map(&[("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT")]),
        at(1_445_412_490),
    );
    assert_eq!(past.retry_after, Some(Duration::ZERO));
}

#[test]
fn malformed_negative_sentinel_and_absurd_values_are_ignored() {
    let seen = parse(
        &map(&[
            ("X-Ratelimit-Limit", "-1"),
            ("X-Ratelimit-Remaining", "lots"),
            ("X-Ratelimit-Reset", "soon"),
            ("X-Ratelimit-Retry", "1e3"),
            ("Retry-After", "-5"),
            ("x-ratelimit-remaining-tokens", "99999999999999999999999"),
            ("x-ratelimit-reset-tokens", "9999999d"),
            ("RateLimit", r#""p";r=-3;t=abc"#),
        ]),
        at(0),
    );
    assert_eq!(seen, ObservedLimit::default());
}

/// A Unix time in milliseconds (or finer), which some APIs send, is
/// read in its unit, not as seconds 30,000 years away.
#[test]
fn a_unix_time_in_milliseconds_or_finer_is_read_in_its_unit() {
    let now = at(1_700_000_000);
    for v in [
        "1700000042",
        "1700000042000",
        "1700000042000.0",
        "1700000042000000",
        "1700000042000000000",
    ] {
        assert_eq!(
            parse_retry_after(v, now),
            Some(Duration::from_secs(42)),
            "{v}"
        );
    }
    assert_eq!(
        parse_retry_after("1700000000250", now),
        Some(Duration::from_millis(250))
    );
    // Past: no wait.
    assert_eq!(
        parse_retry_after("1699999999000", now),
        Some(Duration::ZERO)
    );
}

/// A well-formed time beyond 366 days is 366 days, however it is
/// written: a longer wait never reads as a shorter one (a 370-day
/// `Retry-After`, read as none, left the next attempt the short pause
/// of a 429 without one, where one of 359 days got the wait ceiling).
#[test]
fn a_time_beyond_a_year_is_read_as_a_year() {
    let year = MAX_PERIOD;
    let days = |d: u64| Duration::from_secs(d * 86_400);
    let now = at(1_700_000_000);
    for (v, expected) in [
        ("31017600", days(359)),
        ("31968000", year),
        ("99999999", year),
        ("9999999999", year),
        ("18446744073709551615", year),
        ("Fri, 31 Dec 9999 23:59:59 GMT", year),
    ] {
        assert_eq!(parse_retry_after(v, now), Some(expected), "{v}");
    }
    for v in ["9999999h", "1.5h9999999m", "18446744073709551615s"] {
        assert_eq!(parse_go_duration(v), Some(year), "{v}");
    }
    let seen = parse(
        &map(&[
            ("X-Ratelimit-Remaining", "0"),
            ("X-Ratelimit-Reset", "99999999"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "9999999h"),
        ]),
        now,
    );
    assert_eq!(seen.requests.unwrap().reset, Some(year));
    assert_eq!(seen.tokens.unwrap().reset, Some(year));
}

/// A number too large for 64 bits is no time an upstream means:
/// unreadable, ignored as a malformed value is, in every form a reset
/// or a retry delay takes, not read as a year.
#[test]
fn a_time_too_large_for_64_bits_is_ignored_as_unreadable() {
    let now = at(1_700_000_000);
    let absurd = "99999999999999999999999";
    for v in [absurd, "99999999999999999999999.5", "18446744073709551616"] {
        assert_eq!(parse_retry_after(v, now), None, "{v}");
    }
    for v in [
        "99999999999999999999999999h",
        "99999999999999999999999ms",
        "1h18446744073709551616ns",
        "5124095576030432h",
    ] {
        assert_eq!(parse_go_duration(v), None, "{v}");
    }
    let mut h = HeaderMap::new();
    for name in [
        "x-ratelimit-reset",
        "x-ratelimit-retry",
        "ratelimit-reset",
        "retry-after",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
    ] {
        h.insert(name, HeaderValue::from_static(absurd));
    }
    h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
    h.insert(
        "x-ratelimit-remaining-tokens",
        HeaderValue::from_static("0"),
    );
    h.insert(
        "ratelimit",
        HeaderValue::from_static(r#""p";r=0;t=99999999999999999999999"#),
    );
    let seen = parse(&h, now);
    assert_eq!(seen.requests.as_ref().unwrap().reset, None, "{seen:?}");
    assert_eq!(seen.tokens.as_ref().unwrap().reset, None, "{seen:?}");
    assert_eq!(seen.retry_after, None, "{seen:?}");
}

/// A count sent as a decimal (Reddit's `X-Ratelimit-Remaining:
/// 0.0`) is read, rounded down: a spent counter is not ignored as
/// malformed, which let calls go out into the window it closed.
#[test]
fn a_count_sent_as_a_decimal_is_read_rounded_down() {
    let spent = parse(
        &map(&[
            ("X-Ratelimit-Remaining", "0.0"),
            ("X-Ratelimit-Used", "600"),
            ("X-Ratelimit-Reset", "221"),
        ]),
        at(0),
    );
    assert_eq!(
        spent.requests,
        Some(Observed {
            limit: None,
            remaining: Some(0),
            reset: Some(Duration::from_secs(221)),
            ..Observed::default()
        })
    );
    let some = parse(
        &map(&[
            ("X-Ratelimit-Limit", "600.0"),
            ("X-Ratelimit-Remaining", "4.9"),
        ]),
        at(0),
    );
    let some = some.requests.unwrap();
    assert_eq!((some.limit, some.remaining), (Some(600), Some(4)));
    for v in ["1.", ".5", "1.2.3", "1e3", "-0.0"] {
        assert_eq!(parse_count(v), None, "{v}");
    }
    // The bound holds for decimals too.
    assert_eq!(parse_count(&format!("{MAX_AMOUNT}.0")), Some(MAX_AMOUNT));
    assert_eq!(parse_count(&format!("{MAX_AMOUNT}.5")), None);
}

#[test]
fn most_restrictive_family_wins() {
    let seen = parse(
        &map(&[
            ("X-Ratelimit-Remaining", "50"),
            ("RateLimit-Remaining", "3"),
            ("RateLimit-Reset", "2"),
        ]),
        at(0),
    );
    assert_eq!(seen.requests.unwrap().remaining, Some(3));
}

/// The separate fields of an older draft (`RateLimit-Remaining`,
/// `RateLimit-Reset`) sent with a `RateLimit-Policy` and no
/// `RateLimit-Limit`: the policy's quota is their counter's limit
/// (before, it was dropped, and with it which bucket the counter
/// describes). A `RateLimit-Limit` wins over it.
#[test]
fn separate_fields_take_the_limit_of_a_policy_sent_beside_them() {
    let seen = parse(
        &map(&[
            ("RateLimit-Policy", "100;w=60"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "30"),
        ]),
        at(0),
    );
    let requests = seen.requests.unwrap();
    assert_eq!(
        (requests.limit, requests.remaining, requests.reset),
        (Some(100), Some(0), Some(Duration::from_secs(30)))
    );
    let seen = parse(
        &map(&[
            ("RateLimit-Policy", "\"p\";q=100;w=60"),
            ("RateLimit-Limit", "50"),
            ("RateLimit-Remaining", "7"),
        ]),
        at(0),
    );
    let requests = seen.requests.unwrap();
    assert_eq!((requests.limit, requests.remaining), (Some(50), Some(7)));
}

/// An older draft's `RateLimit-Policy` writes the quota as the bare
/// item (`10;w=1`), not as a `q` parameter: it is the limit, as `q`
/// is. A quoted item is a policy name, never a quota, and a `q` wins
/// over the item.
#[test]
fn an_older_draft_policy_gives_its_quota_as_the_bare_item() {
    let limit = |pairs: &[(&'static str, &'static str)]| {
        parse(&map(pairs), at(0)).requests.and_then(|o| o.limit)
    };
    assert_eq!(limit(&[("RateLimit-Policy", "10;w=1")]), Some(10));
    assert_eq!(
        limit(&[("RateLimit-Policy", "100;w=60, 1000;w=3600")]),
        Some(100)
    );
    let with_counter = parse(
        &map(&[
            ("RateLimit-Policy", "100;w=60"),
            ("RateLimit", "remaining=5, reset=9"),
        ]),
        at(0),
    );
    assert_eq!(
        with_counter.requests,
        Some(Observed {
            limit: Some(100),
            remaining: Some(5),
            reset: Some(Duration::from_secs(9)),
            window: Some(Duration::from_secs(60)),
            policy: None,
        })
    );
    // The newer draft, as before.
    assert_eq!(limit(&[("RateLimit-Policy", r#""10";w=1"#)]), None);
    assert_eq!(limit(&[("RateLimit-Policy", "burst;w=1")]), None);
    assert_eq!(limit(&[("RateLimit-Policy", "10;q=5;w=1")]), Some(5));
    assert_eq!(limit(&[("RateLimit-Policy", "-10;w=1")]), None);
}

/// OpenAI-compatible providers may send a reset in plain seconds
/// (`x-ratelimit-reset-requests: 1`) where OpenAI sends a Go duration:
/// it is read as `X-Ratelimit-Reset` is, rounded up to whole µs (the
/// clock's resolution), so a spent counter keeps its penalty.
#[test]
fn an_openai_reset_in_plain_seconds_is_read() {
    let now = 1_700_000_000;
    let resets = |requests: &'static str, tokens: &'static str| {
        let seen = parse(
            &map(&[
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", requests),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", tokens),
            ]),
            at(now),
        );
        (
            seen.requests.as_ref().and_then(|o| o.reset),
            seen.tokens.and_then(|o| o.reset),
        )
    };
    let secs = |s| Some(Duration::from_secs(s));
    assert_eq!(resets("1", "30"), (secs(1), secs(30)));
    assert_eq!(
        resets("0.5", "2.25"),
        (
            Some(Duration::from_millis(500)),
            Some(Duration::from_millis(2_250))
        )
    );
    assert_eq!(
        resets("0.0000001", "1.0000015"),
        (
            Some(Duration::from_micros(1)),
            Some(Duration::from_micros(1_000_002))
        )
    );
    assert_eq!(resets("0", "99999999"), (secs(0), Some(MAX_PERIOD)));
    assert_eq!(resets("1700000042", "6m0s"), (secs(42), secs(360)));
    for bad in ["-1", "1.", ".5", "1e3", "5d"] {
        assert_eq!(resets(bad, bad), (None, None), "{bad}");
    }
}

/// Two families that tie on `remaining` and `reset` describe one
/// counter: the `limit` either gives is kept, whichever comes first.
#[test]
fn a_tie_between_families_keeps_the_limit_either_gives() {
    let tie = |first_limit: Option<&'static str>, second_limit: Option<&'static str>| {
        let mut pairs = vec![
            ("X-Ratelimit-Remaining", "5"),
            ("X-Ratelimit-Reset", "9"),
            ("RateLimit-Remaining", "5"),
            ("RateLimit-Reset", "9"),
        ];
        pairs.extend(first_limit.map(|l| ("X-Ratelimit-Limit", l)));
        pairs.extend(second_limit.map(|l| ("RateLimit-Limit", l)));
        parse(&map(&pairs), at(0)).requests.unwrap()
    };
    let observed = |limit| Observed {
        limit,
        remaining: Some(5),
        reset: Some(Duration::from_secs(9)),
        ..Observed::default()
    };
    assert_eq!(tie(None, Some("100")), observed(Some(100)));
    assert_eq!(tie(Some("100"), None), observed(Some(100)));
    // Both give one: the first, as before.
    assert_eq!(tie(Some("100"), Some("60")), observed(Some(100)));
    // No tie: the more restrictive reading, limit and all.
    let other = parse(
        &map(&[
            ("X-Ratelimit-Limit", "100"),
            ("X-Ratelimit-Remaining", "5"),
            ("X-Ratelimit-Reset", "9"),
            ("RateLimit-Remaining", "5"),
            ("RateLimit-Reset", "10"),
        ]),
        at(0),
    );
    assert_eq!(other.requests.unwrap().limit, None);
}

#[test]
fn go_durations_edge_cases() {
    assert_eq!(
        parse_go_duration("1h2m3.5s"),
        Some(Duration::from_millis(3_723_500))
    );
    assert_eq!(parse_go_duration("0s"), Some(Duration::ZERO));
    assert_eq!(parse_go_duration("250us"), Some(Duration::from_micros(250)));
    assert_eq!(parse_go_duration("5"), None);
    assert_eq!(parse_go_duration("s"), None);
    assert_eq!(parse_go_duration("1.2.3s"), None);
    assert_eq!(parse_go_duration("3d"), None);
    assert_eq!(parse_go_duration(""), None);
    // The cases its doc example showed when it was public.
    assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
    assert_eq!(parse_go_duration("12ms"), Some(Duration::from_millis(12)));
    assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_go_duration("-5s"), None);
    let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470);
    assert_eq!(
        parse_retry_after("120", now),
        Some(Duration::from_secs(120))
    );
    let date = "Wed, 21 Oct 2015 07:28:00 GMT";
    assert_eq!(parse_retry_after(date, now), Some(Duration::from_secs(10)));
    assert_eq!(parse_retry_after("-1", now), None);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
    /// (Moved from `tests/headers_fuzz.rs` when these two became private.)
    #[test]
    fn any_string_as_go_duration_or_retry_after_never_panics(s in "\\PC{0,30}") {
        let _ = parse_go_duration(&s);
        let parsed = parse_retry_after(&s, SystemTime::now());
        proptest::prop_assert!(parsed.is_none_or(|d| d <= MAX_PERIOD));
    }
}

#[test]
fn a_separator_inside_quotes_or_after_an_escaped_quote_does_not_split() {
    let field = r#""a,b\",c";r=1, d"#;
    assert_eq!(
        split_unquoted(field, ',').collect::<Vec<_>>(),
        [r#""a,b\",c";r=1"#, " d"]
    );
}
