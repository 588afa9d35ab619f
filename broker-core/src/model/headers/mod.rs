//! Reads `X-Ratelimit-*`, IETF `RateLimit`/`RateLimit-Policy` (current and older drafts),
//! OpenAI's `x-ratelimit-*-{requests,tokens}` and `Retry-After` into one [`ObservedLimit`]. A
//! malformed value is ignored, times cap at 366 days; the lowest `remaining` and longest retry win.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};

use super::limits::{MAX_AMOUNT, MAX_PERIOD};
use super::observed::{Observed, ObservedLimit};

/// A reset or retry value at or above this many seconds is a Unix time.
const UNIX_TIME_FROM: u64 = 1_000_000_000;

/// A Unix time at or above this is in milliseconds (then µs, ns per 1,000×).
const UNIX_MILLIS_FROM: u64 = UNIX_TIME_FROM * 1_000;

/// Reads the rate-limit headers of one response; `now` is when it arrived
/// (for HTTP-dates and Unix-time resets).
///
/// ```
/// use broker_core::headers;
/// use http::{HeaderMap, HeaderValue};
/// use std::time::{Duration, SystemTime};
/// let mut h = HeaderMap::new();
/// h.insert("X-Ratelimit-Limit", "300".parse().unwrap());
/// h.insert("X-Ratelimit-Remaining", "0".parse().unwrap());
/// h.insert("X-Ratelimit-Reset", "12".parse().unwrap());
/// h.insert("Retry-After", "not a number".parse().unwrap());
/// let seen = headers::parse(&h, SystemTime::now());
/// let requests = seen.requests.unwrap();
/// assert_eq!(requests.limit, Some(300));
/// assert_eq!(requests.remaining, Some(0));
/// assert_eq!(requests.reset, Some(Duration::from_secs(12)));
/// assert_eq!(seen.retry_after, None);
/// ```
pub fn parse(headers: &HeaderMap, now: SystemTime) -> ObservedLimit {
    let text = |name: &str| headers.get(name).and_then(trimmed);
    // The members of a structured-field list, over all its lines.
    let list = |name: &str| members(headers.get_all(name).iter().filter_map(trimmed));
    let count = |name: &str| text(name).and_then(parse_count);
    // The counter of `{prefix}limit{suffix}`, `...remaining...` and `...reset...`.
    let counter = |prefix: &str, suffix: &str, reset: fn(&str, SystemTime) -> _| Observed {
        limit: count(&format!("{prefix}limit{suffix}")),
        remaining: count(&format!("{prefix}remaining{suffix}")),
        reset: text(&format!("{prefix}reset{suffix}")).and_then(|v| reset(v, now)),
        ..Observed::default()
    };

    let structured = structured_fields(&list("ratelimit"), &list("ratelimit-policy"), now);
    let mut older_ietf = counter("ratelimit-", "", parse_seconds);
    // Without `RateLimit-Limit`, a lone `RateLimit-Policy` gives the quota.
    if older_ietf.limit.is_none() && structured.remaining.is_none() && structured.reset.is_none() {
        older_ietf = Observed {
            remaining: older_ietf.remaining,
            reset: older_ietf.reset,
            ..structured.clone()
        };
    }
    let x_ratelimit = counter("x-ratelimit-", "", parse_seconds);
    let openai = |unit| counter("x-ratelimit-", &format!("-{unit}"), parse_reset);

    // The longer of the two (an `Option`'s `max` keeps a `Some`).
    let retry_after = text("retry-after").and_then(|v| parse_retry_after(v, now));
    let retry_after =
        retry_after.max(text("x-ratelimit-retry").and_then(|v| parse_seconds(v, now)));

    ObservedLimit {
        requests: most_restrictive([x_ratelimit, older_ietf, structured, openai("requests")]),
        tokens: most_restrictive([openai("tokens")]),
        retry_after,
    }
}

/// A header value's text, trimmed; `None` if it is not UTF-8.
fn trimmed(v: &HeaderValue) -> Option<&str> {
    std::str::from_utf8(v.as_bytes()).ok().map(str::trim)
}

/// The reading with the lowest `remaining`, then the latest reset; a tie
/// keeps the first, filling in the other's `limit`, window and policy.
fn most_restrictive<const N: usize>(candidates: [Observed; N]) -> Option<Observed> {
    let seen = candidates.into_iter().filter(|o| *o != Observed::default());
    seen.reduce(
        |b, o| match (b.remaining, b.reset) == (o.remaining, o.reset) {
            _ if more_restrictive(&o, &b) => o,
            true => Observed {
                limit: b.limit.or(o.limit),
                window: b.window.or(o.window),
                policy: b.policy.or(o.policy),
                ..b
            },
            false => b,
        },
    )
}

/// Whether `o` says less is left than `b`.
fn more_restrictive(o: &Observed, b: &Observed) -> bool {
    match (b.remaining, o.remaining) {
        (Some(br), Some(or)) => or < br || (or == br && o.reset > b.reset),
        (None, Some(_)) => true,
        _ => false,
    }
}

/// A count up to `MAX_AMOUNT`; a decimal rounds down (Reddit's `0.0`).
fn parse_count(v: &str) -> Option<u64> {
    let (int, frac) = decimal_parts(v)?;
    let whole = frac.bytes().all(|b| b == b'0');
    int.parse::<u64>()
        .ok()
        .filter(|n| *n < MAX_AMOUNT || (*n == MAX_AMOUNT && whole))
}

/// Integer and fraction digits of a plain decimal (`"42"`, `"0.5"`).
fn decimal_parts(v: &str) -> Option<(&str, &str)> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match v.split_once('.') {
        Some((int, frac)) => (digits(int) && digits(frac)).then_some((int, frac)),
        None => digits(v).then_some((v, "")),
    }
}

/// `d`, at most 366 days.
fn bounded(d: Duration) -> Option<Duration> {
    Some(d.min(MAX_PERIOD))
}

/// Decimal seconds, or from [`UNIX_TIME_FROM`] up a Unix time as a delay
/// from `now`.
fn parse_seconds(v: &str, now: SystemTime) -> Option<Duration> {
    decimal_parts(v)?;
    let nanos = scaled(v, 1_000_000_000)?;
    if nanos < u128::from(UNIX_TIME_FROM) * 1_000_000_000 {
        return bounded(Duration::from_nanos(nanos as u64));
    }
    let at = UNIX_EPOCH.checked_add(unix_time(nanos));
    bounded(at.map_or(MAX_PERIOD, |at| at.duration_since(now).unwrap_or_default()))
}

/// A Unix time of `units` × 10⁻⁹ units (s, ms, µs or ns by its size).
fn unix_time(units: u128) -> Duration {
    let per_second = match units / 1_000_000_000 / u128::from(UNIX_MILLIS_FROM) {
        0 => 1,
        1..1_000 => 1_000,
        1_000..1_000_000 => 1_000_000,
        _ => 1_000_000_000,
    };
    let total = units / per_second;
    let secs = u64::try_from(total / 1_000_000_000).unwrap_or(u64::MAX);
    Duration::new(secs, (total % 1_000_000_000) as u32)
}

/// `Retry-After`: delay-seconds, or an HTTP-date as a delay from `now`.
fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    if v.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        return parse_seconds(v, now);
    }
    let at = httpdate::parse_http_date(v).ok()?;
    bounded(at.duration_since(now).unwrap_or_default())
}

/// A Go duration as OpenAI sends it (`"6m0s"`, `"12ms"`, `"1.5s"`); no sign.
fn parse_go_duration(mut rest: &str) -> Option<Duration> {
    if rest.is_empty() {
        return None;
    }
    let mut total_nanos: u128 = 0;
    // Where the first char of `s` that is (`num`) or is not part of a number is.
    let end = |s: &str, num| s.find(|c: char| (c.is_ascii_digit() || c == '.') == num);
    while !rest.is_empty() {
        let (number, tail) = rest.split_at(end(rest, false).unwrap_or(rest.len()));
        let (unit, tail) = tail.split_at(end(tail, true).unwrap_or(tail.len()));
        let unit_nanos: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        total_nanos = total_nanos.checked_add(scaled(number, unit_nanos)?)?;
        rest = tail;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).ok()?;
    bounded(Duration::new(secs, (total_nanos % 1_000_000_000) as u32))
}

/// An OpenAI-style reset: a Go duration, or plain seconds rounded up to µs.
fn parse_reset(v: &str, now: SystemTime) -> Option<Duration> {
    parse_go_duration(v).or_else(|| {
        let d = parse_seconds(v, now)?;
        bounded(Duration::from_micros(d.as_nanos().div_ceil(1_000) as u64))
    })
}

/// Decimal `number` times `unit_nanos`; `None` past `u64`.
fn scaled(number: &str, unit_nanos: u128) -> Option<u128> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    let whole: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut value = u128::from(whole) * unit_nanos;
    let mut place = unit_nanos;
    for b in frac.bytes().take(18) {
        place /= 10;
        value = value.saturating_add(u128::from(b - b'0') * place);
    }
    Some(value)
}

/// One member of a structured-field list: bare value and parameters.
#[derive(Debug, Default)]
struct Member<'a> {
    name: Option<&'a str>,
    /// An older draft's bare integer quota (`RateLimit-Policy: 10;w=1`).
    integer: Option<u64>,
    params: Vec<(&'a str, &'a str)>,
}

impl<'a> Member<'a> {
    fn get(&self, key: &str) -> Option<&'a str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| *v)
    }
}

/// Splits `s` on `sep` outside double quotes.
fn split_unquoted(s: &str, sep: char) -> impl Iterator<Item = &str> {
    let (mut quoted, mut escaped) = (false, false);
    s.split(move |c| {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            _ => return c == sep && !quoted,
        }
        false
    })
}

fn members<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<Member<'a>> {
    lines
        .flat_map(|line| split_unquoted(line, ','))
        .map(|item| {
            let mut m = Member::default();
            for (i, part) in split_unquoted(item, ';').enumerate() {
                let part = part.trim();
                match part.split_once('=') {
                    Some((k, v)) => m.params.push((k.trim(), v.trim().trim_matches('"'))),
                    None if i == 0 && !part.is_empty() => {
                        if part.bytes().all(|b| b.is_ascii_digit()) {
                            m.integer = parse_count(part);
                        }
                        m.name = Some(part.trim_matches('"'));
                    }
                    None => {}
                }
            }
            m
        })
        .collect()
}

/// IETF `RateLimit` / `RateLimit-Policy` (current and older drafts).
fn structured_fields(items: &[Member<'_>], policies: &[Member<'_>], now: SystemTime) -> Observed {
    // The lowest-quota policy named `name` (any if `None`).
    let policy_of = |name: Option<&str>| {
        let quota = |p: &Member<'_>| p.get("q").map_or(p.integer, parse_count);
        let lowest = (policies.iter())
            .filter(|p| name.is_none() || p.name == name)
            .filter_map(|p| Some((quota(p)?, p)))
            .min_by_key(|(q, _)| *q);
        lowest.map_or_else(Observed::default, |(limit, p)| Observed {
            limit: Some(limit),
            window: (p.get("w").and_then(parse_count))
                .filter(|w| *w > 0)
                .map(Duration::from_secs),
            policy: p.name.filter(|_| p.integer.is_none()).map(Into::into),
            ..Observed::default()
        })
    };
    let best = items.iter().filter_map(|m| {
        Some(Observed {
            remaining: Some(m.get("r").and_then(parse_count)?),
            reset: m.get("t").and_then(|t| parse_seconds(t, now)),
            policy: m.name.map(Into::into),
            ..policy_of(m.name)
        })
    });
    if let Some(best) = best.reduce(|b, o| if more_restrictive(&o, &b) { o } else { b }) {
        return best;
    }
    // The older draft: `limit=100, remaining=42, reset=30` as list members.
    let older = |key: &str| items.iter().find_map(|m| m.get(key));
    // A `limit` other than the policy's quota is another counter's.
    let base = match older("limit").and_then(parse_count) {
        Some(limit) if policy_of(None).limit != Some(limit) => Observed {
            limit: Some(limit),
            ..Observed::default()
        },
        _ => policy_of(None),
    };
    Observed {
        remaining: older("remaining").and_then(parse_count),
        reset: older("reset").and_then(|t| parse_seconds(t, now)),
        ..base
    }
}

#[cfg(test)]
mod tests;
