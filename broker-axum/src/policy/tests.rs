//! Which stage a path meets.

use super::*;

#[test]
fn a_path_with_an_encoded_slash_is_read_both_ways() {
    let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
    let config = PressureConfig::from_json(
        "p.json",
        r#"{"perService": {"api": {"requestsPerSecond": 5}},
            "perRoute": [
            {"resource": "files", "pathPrefix": "/files", "limits": {"requestsPerSecond": 5}},
            {"resource": "private", "pathPrefix": "/files/private", "limits": {"requestsPerSecond": 5}}]}"#,
    )
    .unwrap();
    let policy = Policy::new(broker, &config, None, OnOtherLimits::Refuse).unwrap();
    let names = |path: &str| {
        let stage = policy.stage_for(path).expect(path);
        let parts: Vec<_> = stage
            .parts()
            .map(|s| policy.limited(s).handle.resource().to_string())
            .collect();
        (parts, policy.limited(stage.0).handle.resource().to_string())
    };
    let both = (vec!["files".into(), "private".into()], "files".into());
    assert_eq!(names("/files/private%2Fx"), both);
    assert_eq!(names("/files/private%2fx"), both);
    assert_eq!(
        names("/files%2Fprivate/x").0,
        ["pressure:service:api", "private"]
    );
    // A path without `%` under a prefix that has `%2F`.
    let config = PressureConfig::from_json(
        "p.json",
        r#"{"perRoute": [
            {"resource": "files", "pathPrefix": "/files", "limits": {"requestsPerSecond": 5}},
            {"resource": "ab", "pathPrefix": "/files/a%2Fb", "limits": {"requestsPerSecond": 5}},
            {"resource": "abc", "pathPrefix": "/files/a/b/c", "limits": {"requestsPerSecond": 5}}]}"#,
    )
    .unwrap();
    let slashed = Policy::new(policy.broker.clone(), &config, None, OnOtherLimits::Refuse).unwrap();
    let parts = |path: &str| -> Vec<String> {
        let stage = slashed.stage_for(path).expect(path);
        let limited = |s| slashed.limited(s).handle.resource().to_string();
        stage.parts().map(limited).collect()
    };
    assert_eq!(parts("/files/a/b/y"), ["files", "ab"]);
    assert_eq!(parts("/files/a%2Fb/y"), ["ab"]);
    assert_eq!(parts("/files/a/b/c/d"), ["abc"]);
    assert_eq!(parts("/files/a%2Fb/c/d"), ["ab", "abc"]);
    assert_eq!(parts("/files/a/bc"), ["files"]);
    assert!(slashed.stage_for("*").is_none(), "no route on `/`");
    // One reading: no `%2F`, or both readings meet the same stage.
    assert_eq!(names("/files/private/x").0, ["private"]);
    assert_eq!(names("/files/a%2Fb").0, ["files"]);
    assert_eq!(names("/files/private%252Fx").0, ["files"]);
    assert_eq!(names("/other%2Fx").0, ["pressure:service:api"]);
}

#[test]
fn a_path_that_is_not_one_meets_the_route_on_slash() {
    let broker = ResourceBroker::new(broker_memory::MemoryBackend::new());
    let config = PressureConfig::from_json(
        "p.json",
        r#"{"perRoute": [
            {"resource": "all", "pathPrefix": "/", "limits": {"requestsPerSecond": 5}},
            {"resource": "hooks", "pathPrefix": "/hooks", "limits": {"requestsPerSecond": 5}}]}"#,
    )
    .unwrap();
    let policy = Policy::new(broker, &config, None, OnOtherLimits::Refuse).unwrap();
    for path in ["*", "", "/", "/x"] {
        let stage = policy.stage_for(path).expect(path);
        assert_eq!(policy.limited(stage.0).handle.resource(), "all", "{path:?}");
    }
    let stage = policy.stage_for("/hook%73/x").unwrap();
    assert_eq!(policy.limited(stage.0).handle.resource(), "hooks");
}
