//! Limits and resource settings load from JSON, YAML and TOML into the same
//! types, with human durations and errors that name the source and path.

use std::time::Duration;

use broker_core::config::{parse, Format};
use broker_core::{Limits, RateLimit, ResourceConfig, Unit};

fn expected() -> ResourceConfig {
    let limits = Limits {
        rates: vec![
            RateLimit::per_minute(500),
            RateLimit::per(90_000, Duration::from_secs(60)).unit(Unit::Tokens),
            RateLimit::per(10, Duration::from_secs(120)).with_burst(2),
        ],
        max_concurrent: Some(8),
    };
    ResourceConfig {
        queue_capacity: 50,
        ..ResourceConfig::new(limits)
    }
}

#[test]
fn the_same_config_reads_from_json_yaml_and_toml() {
    let json = r#"{
        "limits": {
            "requestsPerMinute": 500, "tokensPerMinute": 90000, "maxConcurrentRequests": 8,
            "rates": [{"amount": 10, "period": "120s", "burst": 2}]
        },
        "queueCapacity": 50
    }"#;
    let yaml = "
limits:
  requestsPerMinute: 500
  tokensPerMinute: 90000
  maxConcurrentRequests: 8
  rates:
    - {amount: 10, period: 2m, burst: 2}
queueCapacity: 50
";
    let toml = "
queueCapacity = 50
[limits]
requestsPerMinute = 500
tokensPerMinute = 90000
maxConcurrentRequests = 8
rates = [{ amount = 10, period = \"2min\", burst = 2 }]
";
    let want = expected();
    assert_eq!(
        parse::<ResourceConfig>("a.json", json, Format::Json).unwrap(),
        want
    );
    assert_eq!(
        parse::<ResourceConfig>("a.yaml", yaml, Format::Yaml).unwrap(),
        want
    );
    assert_eq!(
        parse::<ResourceConfig>("a.toml", toml, Format::Toml).unwrap(),
        want
    );
}

#[test]
fn errors_name_the_file_and_the_path_inside_it() {
    let cases = [
        (
            r#"{"limits": {"requestsPerSecond": 0}}"#,
            "requestsPerSecond",
        ),
        (
            r#"{"limits": {"rates": [{"amount": 1, "period": "0s"}]}}"#,
            "period",
        ),
        (
            r#"{"limits": {"rates": [{"amount": 1, "period": "soon"}]}}"#,
            "limits.rates[0].period",
        ),
        (r#"{"limits": {}, "queueCapacity": -1}"#, "queueCapacity"),
        (
            r#"{"limits": {}, "retry": {"maxAttempts": 0}}"#,
            "retry.maxAttempts",
        ),
        (r#"{"limits": {}, "queueCapcity": 3}"#, "queueCapcity"),
    ];
    for (text, needle) in cases {
        let err = parse::<ResourceConfig>("broker.json", text, Format::Json)
            .and_then(|c| c.validate().map(|_| c))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("broker.json"), "{err}");
        assert!(err.contains(needle), "{err:?} should name {needle}");
    }
}

/// A settings object written as a list is refused where it stands, in every
/// format, rather than read field by field in declaration order (serde's
/// default for structs), which would take `[5, "1s", 10]` for a rate and
/// silently read two fields of one type in the order the code declares
/// them. Written as objects, the same settings read.
#[test]
fn settings_written_as_lists_are_refused_with_their_path() {
    let cases = [
        (
            Format::Json,
            r#"{"limits": {"rates": [[5, "1s", 10]]}}"#,
            "limits.rates[0]",
        ),
        (
            Format::Json,
            r#"{"limits": [null, null, null, null, []]}"#,
            "limits",
        ),
        (
            Format::Json,
            r#"{"limits": {}, "retry": [3, "100ms"]}"#,
            "retry",
        ),
        (Format::Json, r#"[{"rates": []}, 50]"#, "broker.json"),
        (
            Format::Yaml,
            "limits:\n  rates:\n    - [5, 1s, 10]\n",
            "limits.rates[0]",
        ),
        (
            Format::Toml,
            "[limits]\nrates = [[5, \"1s\", 10]]\n",
            "limits.rates[0]",
        ),
    ];
    for (format, text, needle) in cases {
        let err = parse::<ResourceConfig>("broker.json", text, format)
            .map(|c| format!("{c:?}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(needle),
            "{format:?} {text}: {err:?} should name {needle}"
        );
        // YAML's reader refuses a list for a struct itself, in its words.
        assert!(
            err.contains("an object with named fields") || err.contains("expected struct"),
            "{format:?} {text}: {err:?} should say what is expected"
        );
    }
    let read = parse::<ResourceConfig>(
        "broker.json",
        r#"{"limits": {"rates": [{"amount": 5, "period": "1s", "burst": 10}]}}"#,
        Format::Json,
    )
    .unwrap();
    assert_eq!(read.limits.rates, [RateLimit::per_second(5).with_burst(10)]);
}

/// Reading a document's tree a second time (to refuse lists for
/// settings) refuses nothing else: an unquoted YAML scalar where a string
/// is expected, and a map whose keys are numbers, read as they did.
#[test]
fn the_second_reading_refuses_only_lists() {
    use std::collections::BTreeMap;
    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Named {
        name: String,
        by_id: BTreeMap<u32, String>,
    }
    let yaml = "name: 2024\nby_id: {1: a}\n";
    let read = parse::<Named>("x.yaml", yaml, Format::Yaml).unwrap();
    assert_eq!(read.name, "2024");
    let json = r#"{"name": "n", "by_id": {"1": "a"}}"#;
    let read = parse::<Named>("x.json", json, Format::Json).unwrap();
    assert_eq!(read.by_id, BTreeMap::from([(1, "a".to_owned())]));
}

/// A limit written as `null` (`~` in YAML) loaded as no limit at all: it is
/// refused with its path, in every format that has a null.
#[test]
fn a_limit_written_as_null_is_refused_with_its_path() {
    for (name, text, format) in [
        (
            "a.json",
            r#"{"limits": {"requestsPerSecond": null}}"#,
            Format::Json,
        ),
        ("a.yaml", "limits:\n  requestsPerSecond: ~\n", Format::Yaml),
    ] {
        let e = parse::<ResourceConfig>(name, text, format)
            .unwrap_err()
            .to_string();
        assert!(e.contains("limits.requestsPerSecond"), "{e}");
        assert!(e.contains("null sets no limit"), "{e}");
    }
    for field in [
        "requestsPerMinute",
        "tokensPerMinute",
        "maxConcurrentRequests",
    ] {
        let text = format!(r#"{{"{field}": null}}"#);
        let e = parse::<Limits>("l.json", &text, Format::Json)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("at {field}: null sets no limit")),
            "{e}"
        );
    }
}

/// `queueDeadline`, the default deadline of an `enqueue` call's wait for
/// its turn, reads as a human duration from every format; absent, a call
/// waits as long as the queue holds it; zero or a word is refused with
/// the field's name.
#[test]
fn the_queue_deadline_reads_from_every_format_and_bad_values_name_it() {
    let want = ResourceConfig {
        queue_deadline: Some(Duration::from_secs(30)),
        ..ResourceConfig::new(Limits::new().rate(RateLimit::per_minute(500)))
    };
    let docs = [
        (
            "a.json",
            r#"{"limits": {"requestsPerMinute": 500}, "queueDeadline": "30s"}"#,
            Format::Json,
        ),
        (
            "a.yaml",
            "limits: {requestsPerMinute: 500}\nqueueDeadline: 30s\n",
            Format::Yaml,
        ),
        (
            "a.toml",
            "queueDeadline = \"30s\"\n[limits]\nrequestsPerMinute = 500\n",
            Format::Toml,
        ),
    ];
    for (name, text, format) in docs {
        assert_eq!(parse::<ResourceConfig>(name, text, format).unwrap(), want);
    }
    let none = parse::<ResourceConfig>("a.json", r#"{"limits": {}}"#, Format::Json).unwrap();
    assert_eq!(none.queue_deadline, None);
    for bad in [r#""0s""#, r#""soon""#, "-1"] {
        let text = format!(r#"{{"limits": {{}}, "queueDeadline": {bad}}}"#);
        let err = parse::<ResourceConfig>("broker.json", &text, Format::Json)
            .unwrap_err()
            .to_string();
        assert!(err.contains("queueDeadline"), "{bad}: {err}");
    }
}
