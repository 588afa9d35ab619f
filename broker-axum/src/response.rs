//! What a denied or failed admission answers: `429` with `Retry-After` and the
//! draft `RateLimit-Policy` / `RateLimit` headers (optionally `X-RateLimit-*`).

use std::time::Duration;

use broker_core::{Acquisition, DenyReason, Limits};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};

use crate::body::PermitBody;

// The draft's fields (draft-ietf-httpapi-ratelimit-headers), then the legacy ones.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// How denials and backend failures are answered.
///
/// ```
/// use broker_axum::Responses;
/// let r = Responses { legacy_headers: true, ..Responses::default() };
/// assert_eq!(r.denied_status, 429);
/// ```
#[derive(Debug, Clone)]
pub struct Responses {
    /// Status of a denial. Default `429 Too Many Requests`.
    pub denied_status: StatusCode,
    /// Body of a denial. Default `{"error":"too_many_requests"}`.
    pub denied_body: Bytes,
    /// `Content-Type` of the denial body. Default `application/json`.
    pub denied_content_type: HeaderValue,
    /// Also send the legacy `X-RateLimit-*` headers on denials. Default off.
    pub legacy_headers: bool,
    /// Status when the backend fails past its failure policy. Default `503`.
    pub backend_error_status: StatusCode,
    /// `Retry-After` sent with `backend_error_status`. Default 1 s.
    pub backend_error_retry_after: Duration,
}

impl Default for Responses {
    fn default() -> Self {
        Self {
            denied_status: StatusCode::TOO_MANY_REQUESTS,
            denied_body: Bytes::from_static(br#"{"error":"too_many_requests"}"#),
            denied_content_type: HeaderValue::from_static("application/json"),
            legacy_headers: false,
            backend_error_status: StatusCode::SERVICE_UNAVAILABLE,
            backend_error_retry_after: Duration::from_secs(1),
        }
    }
}

/// `Retry-After` seconds for a wait: rounded up, never below 1.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let part_second = u64::from(wait.subsec_nanos() > 0);
    wait.as_secs().saturating_add(part_second).max(1)
}

/// A structured-field string: printable ASCII, `"` and `\` escaped.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => out.extend(['\\', c]),
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// The response to `denial` on `resource` under `limits`; a denial by the
/// concurrency limit has no `RateLimit` field and no remaining count.
pub(crate) fn denied<B: PermitBody>(
    responses: &Responses,
    resource: &str,
    limits: &Limits,
    denial: &Acquisition,
) -> Response<B> {
    let secs = retry_after_secs(denial.wait_time);
    let by_concurrency = denial.denied_by == Some(DenyReason::Concurrency);
    let (status, body) = (responses.denied_status, responses.denied_body.clone());
    let mut res = refusal(status, body, responses.denied_content_type.clone(), secs);
    let h = res.headers_mut();
    let name = |i: usize| match i {
        0 => sf_string(resource),
        _ => sf_string(&format!("{resource}#{i}")),
    };
    // The quota is what a window refills, not the burst.
    let items: Vec<String> = (limits.rates.iter().enumerate())
        .map(|(i, r)| (name(i), r.amount, retry_after_secs(r.period)))
        .map(|(name, q, w)| format!("{name};q={q};w={w}"))
        .collect();
    // Structured-field strings and numbers are valid field values.
    let value = |s: String| HeaderValue::try_from(s).expect("printable ASCII");
    if !items.is_empty() {
        h.insert(RATELIMIT_POLICY, value(items.join(", ")));
    }
    // With several rate limits, a denial cannot say which ran out.
    let only = match limits.rates.as_slice() {
        [rate] => Some(rate.amount),
        _ => None,
    };
    if let (Some(_), false) = (only, by_concurrency) {
        h.insert(RATELIMIT, value(format!("{};r=0;t={secs}", name(0))));
    }
    if responses.legacy_headers {
        if let Some(limit) = only {
            h.insert(X_RATELIMIT_LIMIT, HeaderValue::from(limit));
        }
        if !by_concurrency {
            h.insert(X_RATELIMIT_REMAINING, HeaderValue::from(0));
            h.insert(X_RATELIMIT_RESET, HeaderValue::from(secs));
        }
    }
    res
}

/// The response when the broker could not answer.
pub(crate) fn backend_failed<B: PermitBody>(responses: &Responses) -> Response<B> {
    refusal(
        responses.backend_error_status,
        Bytes::from_static(br#"{"error":"limiter_unavailable"}"#),
        HeaderValue::from_static("application/json"),
        retry_after_secs(responses.backend_error_retry_after),
    )
}

/// A `status` response of `body` (`content_type`), `Retry-After: secs`.
fn refusal<B: PermitBody>(
    status: StatusCode,
    body: Bytes,
    content_type: HeaderValue,
    secs: u64,
) -> Response<B> {
    let mut res = Response::new(B::from_bytes(body));
    *res.status_mut() = status;
    res.headers_mut().insert(CONTENT_TYPE, content_type);
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::{Permit, RateLimit};

    /// A denial after `wait`, by the concurrency limit if `by_concurrency`.
    fn denial(wait: Duration, by_concurrency: bool) -> Acquisition {
        let reason = [DenyReason::Rate, DenyReason::Concurrency][usize::from(by_concurrency)];
        Acquisition {
            allowed: false,
            wait_time: wait,
            denied_by: Some(reason),
            permit: Permit::empty(),
            answered_here: false,
        }
    }

    /// The `RateLimit-Policy` field of a denial on `resource` under `limits`.
    fn policy_of(resource: &str, limits: &Limits) -> String {
        let res: Response<axum::body::Body> = denied(
            &Responses::default(),
            resource,
            limits,
            &denial(Duration::ZERO, false),
        );
        res.headers()[RATELIMIT_POLICY].to_str().unwrap().to_owned()
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn policy_header_lists_every_rate_with_its_window() {
        let limits = Limits::new()
            .rate(RateLimit::per_second(100))
            .rate(RateLimit::per_minute(6000));
        assert_eq!(
            policy_of("gw:route", &limits),
            r#""gw:route";q=100;w=1, "gw:route#1";q=6000;w=60"#
        );
    }

    #[test]
    fn odd_resource_names_are_escaped_in_headers() {
        let limits = Limits::new().rate(RateLimit::per_second(1));
        assert_eq!(policy_of("a\"b\\c\u{e9}", &limits), r#""a\"b\\c_";q=1;w=1"#);
    }

    #[test]
    fn denial_carries_retry_after_and_draft_headers() {
        let limits = Limits::new().rate(RateLimit::per_minute(2));
        let responses = Responses {
            legacy_headers: true,
            ..Responses::default()
        };
        let res: Response<axum::body::Body> = denied(
            &responses,
            "r",
            &limits,
            &denial(Duration::from_millis(29_001), false),
        );
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[RETRY_AFTER], "30");
        assert_eq!(res.headers()[RATELIMIT], r#""r";r=0;t=30"#);
        assert_eq!(res.headers()[X_RATELIMIT_LIMIT], "2");
        assert_eq!(res.headers()[X_RATELIMIT_RESET], "30");
    }

    #[test]
    fn the_quota_is_what_a_window_refills_not_the_burst() {
        let limits = Limits::new().rate(RateLimit::per_minute(10).with_burst(1));
        assert_eq!(policy_of("b", &limits), r#""b";q=10;w=60"#);
    }

    #[test]
    fn a_denial_names_no_policy_it_cannot_tell_ran_out() {
        let responses = Responses {
            legacy_headers: true,
            ..Responses::default()
        };
        let wait = Duration::from_secs(30);
        let two = Limits::new()
            .rate(RateLimit::per_second(100))
            .rate(RateLimit::per_minute(2));
        let res: Response<axum::body::Body> = denied(&responses, "two", &two, &denial(wait, false));
        assert_eq!(res.headers()[RETRY_AFTER], "30");
        assert!(res.headers().contains_key(RATELIMIT_POLICY));
        assert!(!res.headers().contains_key(RATELIMIT));
        assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT));
        assert_eq!(res.headers()[X_RATELIMIT_REMAINING], "0");

        let one = Limits::new().rate(RateLimit::per_minute(1000));
        let res: Response<axum::body::Body> =
            denied(&responses, "one", &one, &denial(Duration::ZERO, true));
        assert_eq!(res.headers()[RETRY_AFTER], "1");
        assert!(!res.headers().contains_key(RATELIMIT));
        assert!(!res.headers().contains_key(X_RATELIMIT_REMAINING));
        assert_eq!(res.headers()[X_RATELIMIT_LIMIT], "1000");
    }
}
