//! The failure policy lives above the stores (`broker_core::Failover`): the
//! Redis store embeds no fallback store, so it depends on no other store
//! crate. The check reads this crate's manifest.

#[test]
fn the_redis_store_depends_on_no_other_store() {
    let manifest = include_str!("../Cargo.toml");
    let dependencies = manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .collect::<Vec<_>>();
    assert_eq!(dependencies.len(), 1, "one [dependencies] section");
    for line in dependencies[0].lines().skip(1) {
        let name = line.split('=').next().unwrap_or("").trim();
        assert!(
            name != "broker-memory",
            "broker-redis depends on broker-memory: {line}"
        );
    }
}
