//! The `pressure` config's parsing and validation, by example.

use super::*;
use broker_core::RateLimit;

#[test]
fn routes_and_stages_written_as_lists_are_refused_with_their_path() {
    for (text, needle) in [
        (
            r#"{"perRoute": [["r", "/a", {"requestsPerSecond": 5}]]}"#,
            "perRoute[0]",
        ),
        (
            r#"{"perTenant": [true, {"requestsPerMinute": 60}]}"#,
            "perTenant",
        ),
        (r#"[true, {}]"#, "inline"),
    ] {
        let e = PressureConfig::from_json("inline", text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{text}: {e:?} should name {needle}");
        assert!(e.contains("an object with named fields"), "{text}: {e:?}");
    }
    let doc = r#"{"pressure": {"perRoute": [["r", "/a", {"requestsPerSecond": 5}]]}}"#;
    let e = PressureConfig::from_document("kb.json", doc)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pressure.perRoute[0]"), "{e:?}");
    assert!(e.contains("an object with named fields"), "{e:?}");
}

/// A JSON reader keeps the last of two keys: a service named twice is
/// refused at its object, from `from_json` and from `from_document`.
#[test]
fn a_service_named_twice_is_refused_with_its_path() {
    let twice =
        r#"{"perService": {"rest": {"requestsPerSecond": 5}, "rest": {"requestsPerSecond": 500}}}"#;
    let e = PressureConfig::from_json("p.json", twice)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("at perService: the key `rest` is written twice"),
        "{e}"
    );
    let doc = format!(r#"{{"gateway": {{"pressure": {twice}}}}}"#);
    let e = PressureConfig::from_document("kb.json", &doc)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("at gateway.pressure.perService: the key `rest` is written twice"),
        "{e}"
    );
}

const SEED: &str = r#"{
  "gateway": {
    "pressure": {
      "enabled": true,
      "perService": { "rest": { "requestsPerSecond": 50 } },
      "perRoute": [{
        "resource": "gateway:route:webhooks-github",
        "pathPrefix": "/api/v1/webhooks/github",
        "limits": { "requestsPerSecond": 100, "maxConcurrentRequests": 200 }
      }],
      "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 6000 } }
    }
  }
}"#;

#[test]
fn seed_document_parses_to_its_limits() {
    let c = PressureConfig::from_document("kb.config.json", SEED).unwrap();
    assert!(c.enabled);
    assert_eq!(c.per_service["rest"].rates[0].amount, 50);
    let route = &c.per_route[0];
    assert_eq!(route.resource, "gateway:route:webhooks-github");
    assert_eq!(route.path_prefix, "/api/v1/webhooks/github");
    assert_eq!(route.limits.rates[0].amount, 100);
    assert_eq!(route.limits.max_concurrent, Some(200));
    assert!(c.per_tenant.enabled);
    assert_eq!(
        c.per_tenant.limits.rates[0].period,
        std::time::Duration::from_secs(60)
    );
    assert_eq!(c.per_tenant.resource, DEFAULT_TENANT_RESOURCE);
}

#[test]
fn zero_limit_error_names_the_full_path() {
    let doc = SEED.replace("\"requestsPerSecond\": 100", "\"requestsPerSecond\": 0");
    let e = PressureConfig::from_document("kb.config.json", &doc)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("kb.config.json: "), "{e}");
    assert!(e.contains("gateway.pressure.perRoute[0].limits"), "{e}");
    assert!(e.contains("requestsPerSecond"), "{e}");
}

#[test]
fn unknown_field_is_rejected_with_its_path() {
    let doc = SEED.replace("\"pathPrefix\"", "\"pathprefix\"");
    let e = PressureConfig::from_document("x.json", &doc)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gateway.pressure.perRoute[0]"), "{e}");
    assert!(e.contains("pathprefix"), "{e}");
}

#[test]
fn path_prefix_without_slash_is_rejected() {
    let doc = SEED.replace("\"/api/v1/webhooks/github\"", "\"api\"");
    let e = PressureConfig::from_document("x.json", &doc)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gateway.pressure.perRoute[0].pathPrefix"), "{e}");
}

/// A rate in tokens would never be charged by the layers (one request,
/// no tokens, per request): refused where it stands, at each level.
#[test]
fn a_rate_in_tokens_is_rejected_with_its_path() {
    for (text, path) in [
        (
            r#"{"perService": {"rest": {"tokensPerMinute": 2}}}"#,
            "perService.rest",
        ),
        (
            r#"{"perRoute": [{"resource": "r", "pathPrefix": "/a",
                "limits": {"requestsPerSecond": 5, "tokensPerMinute": 2}}]}"#,
            "perRoute[0].limits",
        ),
        (
            r#"{"perTenant": {"enabled": true, "limits": {"tokensPerMinute": 1}}}"#,
            "perTenant.limits",
        ),
    ] {
        let e = PressureConfig::from_json("p.json", text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(path), "{e}");
        assert!(e.contains("tokens"), "{e}");
    }
}

/// An object closed one brace early leaves the rest of the text after
/// it: refused, not read up to there (which dropped `perRoute`).
#[test]
fn text_after_the_config_is_refused_not_dropped() {
    let text = r#"{"perService": {"rest": {"requestsPerSecond": 50}}},
        "perRoute": [{"resource": "r", "pathPrefix": "/a", "limits": {"requestsPerSecond": 1}}]}"#;
    let e = PressureConfig::from_json("p.json", text)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("p.json: "), "{e}");
    assert!(e.contains("trailing characters at line 1"), "{e}");
    // Whitespace after the object is no text.
    assert!(PressureConfig::from_json("p.json", "{}\n\t ").is_ok());
}

#[test]
fn enabled_tenant_stage_without_limits_is_rejected() {
    let e = PressureConfig::from_json("p.json", r#"{"perTenant": {"enabled": true}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("perTenant.limits"), "{e}");
}

#[test]
fn duplicate_route_resource_is_rejected() {
    let text = r#"{"perRoute": [
        {"resource": "r", "pathPrefix": "/a", "limits": {}},
        {"resource": "r", "pathPrefix": "/b", "limits": {}}]}"#;
    let e = PressureConfig::from_json("p.json", text)
        .unwrap_err()
        .to_string();
    assert!(e.contains("perRoute[1].resource"), "{e}");
}

#[test]
fn a_slash_inside_a_segment_is_a_prefix_of_its_own() {
    let text = r#"{"perRoute": [
        {"resource": "r1", "pathPrefix": "/files/a%2Fb", "limits": {}},
        {"resource": "r2", "pathPrefix": "/files/a/b", "limits": {}},
        {"resource": "r3", "pathPrefix": "/files/caf\u00e9", "limits": {}}]}"#;
    let config = PressureConfig::from_json("p.json", text).unwrap();
    assert_eq!(config.per_route.len(), 3);
}

#[test]
fn a_prefix_that_could_never_match_is_rejected() {
    for (a, b, field) in [
        ("/a", "/a", "perRoute[1].pathPrefix"),
        ("/a?x=1", "/b", "perRoute[0].pathPrefix"),
        ("/a", "/b#top", "perRoute[1].pathPrefix"),
        // Characters requests send percent-encoded.
        ("/a", "/my hooks", "perRoute[1].pathPrefix"),
        ("/a", "/b\t", "perRoute[1].pathPrefix"),
        // The same path as the first, once unreserved letters are decoded.
        ("/ab", "/a%62", "perRoute[1].pathPrefix"),
        ("/caf\u{e9}", "/caf%C3%A9", "perRoute[1].pathPrefix"),
        ("/users/%40me", "/users/@me", "perRoute[1].pathPrefix"),
        ("/a/b%2F", "/a/b%2f", "perRoute[1].pathPrefix"),
    ] {
        let text = format!(
            r#"{{"perRoute": [
            {{"resource": "r1", "pathPrefix": "{a}", "limits": {{}}}},
            {{"resource": "r2", "pathPrefix": "{b}", "limits": {{}}}}]}}"#
        );
        let e = PressureConfig::from_json("p.json", &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{a} {b}: {e}");
    }
}

#[test]
fn a_prefix_written_as_a_route_template_is_rejected() {
    for (prefix, segment) in [
        ("/users/:id", ":id"),
        ("/users/{id}/orders", "{id}"),
        ("/files/{*rest}", "{*rest}"),
        ("/files/*", "*"),
        ("/files/*path", "*path"),
        ("/v1/item-{n}", "item-{n}"),
    ] {
        let text = format!(
            r#"{{"perRoute": [{{"resource": "r", "pathPrefix": "{prefix}", "limits": {{}}}}]}}"#
        );
        let e = PressureConfig::from_json("p.json", &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("perRoute[0].pathPrefix"), "{prefix}: {e}");
        assert!(e.contains(&format!("holds `{segment}`")), "{prefix}: {e}");
    }
    // A `:` or `*` inside a segment, a lone brace, and a parameter's
    // first character percent-encoded are literal.
    for prefix in [
        "/a:b",
        "/time/12:00",
        "/x*y",
        "/a{b",
        "/users/%3Aid",
        "/%2A",
    ] {
        let text = format!(
            r#"{{"perRoute": [{{"resource": "r", "pathPrefix": "{prefix}", "limits": {{}}}}]}}"#
        );
        assert!(
            PressureConfig::from_json("p.json", &text).is_ok(),
            "{prefix}"
        );
    }
}

#[test]
fn a_document_with_two_pressure_objects_is_an_error_naming_both() {
    let doc = r#"{"staging": {"pressure": {"enabled": true}},
                  "gateway": {"pressure": {"enabled": false}}}"#;
    let e = PressureConfig::from_document("x.json", doc)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gateway.pressure"), "{e}");
    assert!(e.contains("staging.pressure"), "{e}");
    let doc = r#"{"pressure": {}, "gateway": {"pressure": {}}}"#;
    let e = PressureConfig::from_document("x.json", doc)
        .unwrap_err()
        .to_string();
    assert!(e.contains("at pressure"), "{e}");
    assert!(e.contains("gateway.pressure"), "{e}");
    // One, at either depth, is found; a `pressure` one level down that
    // is no object is something else's.
    let one = r#"{"boiler": {"pressure": 3.2}, "gateway": {"pressure": {"enabled": false}}}"#;
    assert!(
        !PressureConfig::from_document("x.json", one)
            .unwrap()
            .enabled
    );
}

/// The seed's own gateway file, verbatim, loads with `from_json`, the
/// loader the README shows, into what `from_document` reads.
#[test]
fn the_seed_gateway_document_loads_with_from_json() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/seed-configs/kb.config.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let c = PressureConfig::from_json("kb.config.json", &text).unwrap();
    assert_eq!(
        c,
        PressureConfig::from_document("kb.config.json", &text).unwrap()
    );
    assert_eq!(c, PressureConfig::from_json("inline", SEED).unwrap());
    assert_eq!(
        c.per_service["rest"],
        Limits::new().rate(RateLimit::per_second(50))
    );
    assert_eq!(c.per_route[0].limits.max_concurrent, Some(200));
    assert!(c.per_tenant.enabled);
    assert_eq!(c.per_tenant.limits.rates, [RateLimit::per_minute(6000)]);
    // The object itself still reads as it did, and a field of it that
    // is misspelt is still named, not taken for a document.
    let typo = r#"{"enabled": true, "perServce": {"rest": {"requestsPerSecond": 5}}}"#;
    let e = PressureConfig::from_json("p.json", typo)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `perServce`"), "{e}");
}

/// `perTenant` limits written without `"enabled"` limit the tenants
/// (they loaded as a stage turned off, limiting nothing); written
/// with `"enabled": false`, they stay off.
#[test]
fn tenant_limits_written_without_enabled_are_applied() {
    let text = r#"{"perTenant": {"limits": {"requestsPerMinute": 60}}}"#;
    let c = PressureConfig::from_json("p.json", text).unwrap();
    assert!(c.per_tenant.enabled);
    assert_eq!(c.per_tenant.limits.rates, [RateLimit::per_minute(60)]);
    let doc = format!(r#"{{"gateway": {{"pressure": {text}}}}}"#);
    assert!(
        PressureConfig::from_document("kb.json", &doc)
            .unwrap()
            .per_tenant
            .enabled
    );
    let off = r#"{"perTenant": {"enabled": false, "limits": {"requestsPerMinute": 60}}}"#;
    assert!(
        !PressureConfig::from_json("p.json", off)
            .unwrap()
            .per_tenant
            .enabled
    );
    // Nothing written, nothing enabled.
    let none = r#"{"perTenant": {"resource": "tenants"}}"#;
    assert!(
        !PressureConfig::from_json("p.json", none)
            .unwrap()
            .per_tenant
            .enabled
    );
}

/// A limit written as `null` is refused with its path: it loaded as
/// no limit and exempted the route.
#[test]
fn a_null_limit_is_refused_with_its_path() {
    for field in [
        "requestsPerSecond",
        "requestsPerMinute",
        "maxConcurrentRequests",
    ] {
        let text = format!(
            r#"{{"perRoute": [{{"resource": "r", "pathPrefix": "/a", "limits": {{"{field}": null}}}}]}}"#
        );
        let e = PressureConfig::from_json("p.json", &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("perRoute[0].limits.{field}")), "{e}");
        assert!(e.contains("null"), "{e}");
        let doc = format!(r#"{{"gateway": {{"pressure": {text}}}}}"#);
        let e = PressureConfig::from_document("kb.json", &doc)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("gateway.pressure.perRoute[0].limits.{field}")),
            "{e}"
        );
    }
}

/// A number too large for any field (`1e400`) is named by its path
/// through `from_document`, not by a line and column alone.
#[test]
fn an_out_of_range_number_names_its_field() {
    let doc = SEED.replace("\"requestsPerSecond\": 50", "\"requestsPerSecond\": 1e400");
    for e in [
        PressureConfig::from_document("kb.config.json", &doc),
        PressureConfig::from_json("kb.config.json", &doc),
    ] {
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("gateway.pressure.perService.rest.requestsPerSecond"),
            "{e}"
        );
    }
}

#[test]
fn document_without_pressure_is_an_error() {
    let e = PressureConfig::from_document("x.json", r#"{"gateway": {}}"#).unwrap_err();
    assert!(e.to_string().contains("no `pressure`"), "{e}");
}
