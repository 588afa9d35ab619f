//! Supplier configs (the YAML shape of the ETM rate limiter) and the JSON
//! `pressure` limits load into the same types; errors name the file, the
//! path inside it and what is wrong.

use std::time::Duration;

use broker_core::config::{parse, Format};
use broker_core::supplier::{Backoff, Mode, SupplierConfig};
use broker_core::{Limits, RateLimit};

const ETM: &str = "
rate_limit:
  auth:
    login:
      rate: 1
      period: 120s
      mode: wait
  data:
    price:
      rate: 1
      period: 1s
      mode: skip_and_reschedule
      backoff: { initial: 500ms, max: 30s, factor: 2 }
    goods:
      rate: 1
      period: 1s
      mode: skip_and_reschedule
    remains:
      rate: 1
      period: 1s
      mode: skip_and_reschedule
    async_poll:
      rate: 2
      period: 1s
      mode: skip_and_reschedule
  egress_ip: true
";

#[test]
fn the_etm_supplier_file_loads_into_bucket_classes() {
    let c = parse::<SupplierConfig>("etm.yaml", ETM, Format::Yaml).unwrap();
    let login = &c.rate_limit.auth["login"];
    assert_eq!(
        login.limits,
        Limits::new().rate(RateLimit::per(1, Duration::from_secs(120)))
    );
    let price = &c.rate_limit.data["price"];
    assert_eq!(price.mode, Mode::SkipAndReschedule);
    assert_eq!(
        price.backoff,
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            factor: 2.0
        }
    );
    assert_eq!(c.rate_limit.data["async_poll"].limits.rates[0].amount, 2);
    assert_eq!(c.rate_limit.data.len(), 4);
    assert!(c.rate_limit.egress_ip);
}

#[test]
fn an_auth_bucket_in_skip_mode_is_refused_with_its_path() {
    let text =
        "rate_limit:\n  auth:\n    login: { rate: 1, period: 120s, mode: skip_and_reschedule }\n";
    let err = parse::<SupplierConfig>("etm.yaml", text, Format::Yaml)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("etm.yaml: at rate_limit.auth.login"),
        "{err}"
    );
    assert!(err.contains("mode `wait`"), "{err}");
}

#[test]
fn bad_values_are_refused_with_file_path_and_reason() {
    let cases = [
        (
            "rate_limit:\n  data:\n    price: { rate: 0, period: 1s }\n",
            "rate_limit.data.price",
            "rate: must be greater than zero",
        ),
        (
            "rate_limit:\n  data:\n    price: { rate: 1, period: soon }\n",
            "rate_limit.data.price.period",
            "",
        ),
        (
            "rate_limit:\n  data:\n    price: { rate: 1, period: 1s, backoff: { initial: 2s, max: 1s, factor: 2 } }\n",
            "rate_limit.data.price",
            "backoff.max",
        ),
        (
            "rate_limit:\n  data:\n    price: { rate: 1, period: 1s, backoff: { initial: 1s, max: 2s, factor: 0.5 } }\n",
            "rate_limit.data.price",
            "backoff.factor",
        ),
        (
            "rate_limit:\n  data:\n    price: { rate: 1, period: 1s, mode: sometimes }\n",
            "rate_limit.data.price.mode",
            "sometimes",
        ),
        (
            "rate_limit:\n  dta: {}\n",
            "rate_limit",
            "dta",
        ),
    ];
    for (text, path, reason) in cases {
        let err = parse::<SupplierConfig>("supplier.yaml", text, Format::Yaml)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("supplier.yaml: "), "{err}");
        assert!(err.contains(path), "{text}: {err}");
        assert!(err.contains(reason), "{text}: {err}");
    }
}

/// A rate or burst above the largest amount a bucket holds is refused
/// naming the field the file writes (`rate` or `burst`), not the
/// `rates[0]` of the limits it compiles to, which the file has no such
/// field as; in the `pressure` shorthands, the shorthand alone.
#[test]
fn a_rate_or_burst_too_large_names_its_own_field() {
    let huge = broker_core::limits::MAX_AMOUNT + 1;
    for (bucket, field) in [
        (
            format!("{{ rate: {huge}, period: 1s }}"),
            ": rate: must be at most",
        ),
        (
            format!("{{ rate: 1, period: 1s, burst: {huge} }}"),
            ": burst: must be at most",
        ),
    ] {
        let text = format!("rate_limit:\n  data:\n    price: {bucket}\n");
        let err = parse::<SupplierConfig>("supplier.yaml", &text, Format::Yaml)
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{text}: {err}");
        assert!(!err.contains("rates[0]"), "{text}: {err}");
    }
    let text = format!(r#"{{"requestsPerSecond": {huge}}}"#);
    let err = parse::<Limits>("p.json", &text, Format::Json)
        .unwrap_err()
        .to_string();
    assert!(err.contains("requestsPerSecond: must be at most"), "{err}");
    let text = format!(r#"{{"rates": [{{"amount": 1, "period": "1s", "burst": {huge}}}]}}"#);
    let err = parse::<Limits>("p.json", &text, Format::Json)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rates[0].burst: must be at most"), "{err}");
}

#[test]
fn pressure_json_and_supplier_yaml_load_into_the_same_limits() {
    // A `limits` object of the gateway's `pressure` config and a supplier
    // bucket that say the same thing are the same `Limits`.
    let pressure: Limits = parse(
        "kb.config.json",
        r#"{ "requestsPerMinute": 6000 }"#,
        Format::Json,
    )
    .unwrap();
    let supplier = parse::<SupplierConfig>(
        "s.yaml",
        "rate_limit:\n  data:\n    feed: { rate: 6000, period: 60s }\n",
        Format::Yaml,
    )
    .unwrap();
    assert_eq!(supplier.rate_limit.data["feed"].limits, pressure);
    // And the pressure error names the file and the path.
    let err = parse::<Limits>(
        "kb.config.json",
        r#"{ "requestsPerSecond": 0 }"#,
        Format::Json,
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("kb.config.json: "), "{err}");
    assert!(err.contains("requestsPerSecond"), "{err}");
}

/// A bucket written as a list is refused with its path, not read by field
/// position (JSON; YAML's reader refuses a list for a struct itself).
#[test]
fn a_bucket_written_as_a_list_is_refused_with_its_path() {
    let json = r#"{"rate_limit": {"auth": {"login": [1, "120s", 5, "wait"]}}}"#;
    let err = parse::<SupplierConfig>("etm.json", json, Format::Json)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rate_limit.auth.login"), "{err:?}");
    assert!(err.contains("an object with named fields"), "{err:?}");
}

/// A bucket named twice is refused at its mapping, in JSON and in YAML
/// (either reader would keep the second one).
#[test]
fn a_bucket_named_twice_is_refused_with_its_path() {
    let bucket = r#"{"rate": 1, "period": "1s", "mode": "skip_and_reschedule"}"#;
    let json = format!(r#"{{"rate_limit": {{"data": {{"price": {bucket}, "price": {bucket}}}}}}}"#);
    let err = parse::<SupplierConfig>("etm.json", &json, Format::Json)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("at rate_limit.data: the key `price` is written twice"),
        "{err:?}"
    );
    let yaml = "rate_limit:\n  data:\n    price: {rate: 1, period: 1s, mode: skip_and_reschedule}\n    price: {rate: 2, period: 1s, mode: skip_and_reschedule}\n";
    let err = parse::<SupplierConfig>("etm.yaml", yaml, Format::Yaml)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rate_limit.data: the key `price` is written twice"),
        "{err:?}"
    );
}

/// A bucket whose name YAML reads as a number (or a boolean, or null)
/// written twice, or once plain and once quoted, is refused like any
/// other name written twice: the reader would keep the second bucket
/// (here a hundred times the first's rate) without a word.
#[test]
fn a_bucket_with_a_number_name_written_twice_is_refused() {
    const SLOW: &str = "{rate: 1, period: 1s, mode: skip_and_reschedule}";
    const FAST: &str = "{rate: 100, period: 1s, mode: skip_and_reschedule}";
    for (first, second) in [
        ("1", "1"),
        ("1", "\"1\""),
        ("true", "'true'"),
        ("2.5", "2.5"),
    ] {
        let yaml = format!("rate_limit:\n  data:\n    {first}: {SLOW}\n    {second}: {FAST}\n");
        let read = parse::<SupplierConfig>("etm.yaml", &yaml, Format::Yaml)
            .map(|c| format!("{:?}", c.rate_limit.data));
        let err = read.unwrap_err().to_string();
        assert!(
            err.contains("rate_limit.data: the key") && err.contains("is written twice"),
            "{first} {second}: {err:?}"
        );
    }
    // A list as a key is no name (the check stops there): the document
    // still loads when its type reads it.
    let listed: std::collections::BTreeMap<Vec<String>, u32> =
        parse("k.yaml", "? [a, b]\n: 1\n", Format::Yaml).unwrap();
    assert_eq!(listed.len(), 1);
}

/// YAML documents the repeated-key check must leave alone: number keys
/// that read alike (names as written), a number key beyond 64 bits, a
/// tagged value, an empty document.
#[test]
fn yaml_documents_without_a_repeated_name_still_load() {
    const B: &str = "{rate: 1, period: 1s, mode: skip_and_reschedule}";
    for (keys, n) in [(["1.1", "1.10"], 2), (["0x10", "16"], 2)] {
        let yaml = format!(
            "rate_limit:\n  data:\n    {}: {B}\n    {}: {B}\n",
            keys[0], keys[1]
        );
        let c = parse::<SupplierConfig>("v.yaml", &yaml, Format::Yaml).unwrap();
        assert_eq!(c.rate_limit.data.len(), n, "{keys:?}");
    }
    let yaml = format!("rate_limit:\n  data:\n    123456789012345678901234: {B}\n");
    let c = parse::<SupplierConfig>("v.yaml", &yaml, Format::Yaml).unwrap();
    assert_eq!(c.rate_limit.data.len(), 1);
    let yaml = "rate_limit:\n  data:\n    price:\n      rate: 1\n      period: 1s\n      mode: !skip_and_reschedule\n";
    let c = parse::<SupplierConfig>("v.yaml", yaml, Format::Yaml).unwrap();
    assert_eq!(c.rate_limit.data["price"].mode, Mode::SkipAndReschedule);
    let empty: std::collections::BTreeMap<String, u32> =
        parse("e.yaml", "# nothing yet\n", Format::Yaml).unwrap();
    assert!(empty.is_empty());
}
