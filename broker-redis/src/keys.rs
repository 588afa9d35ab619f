//! Redis key names. Every key of one resource shares the hash tag
//! `{resource key}`, so multi-key scripts run on Redis Cluster.

use broker_core::BackendError;

/// The two keys of one resource state: the bucket hash and the lease set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyPair {
    /// `prefix:{key}:b`, a hash of `n`, `tokens:i`, `ts:i`, `nb:i`; with
    /// `n` = 0 (no rate limit), `hold`, the end of a penalty.
    pub(crate) buckets: String,
    /// `prefix:{key}:l`, a sorted set of lease id -> expiry.
    pub(crate) leases: String,
}

impl KeyPair {
    pub(crate) fn both(&self) -> [&str; 2] {
        [&self.buckets, &self.leases]
    }
}

/// Checks a key prefix: braces would move the hash tag.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), BackendError> {
    if prefix.contains(['{', '}']) {
        return Err(BackendError::new(format!(
            "redis key prefix {prefix:?} must not contain '{{' or '}}' (they would move the hash tag)"
        )));
    }
    Ok(())
}

/// The keys of the state `key` (built by `broker_core::keys`, which escapes
/// braces). An empty key is refused: `{}` is no hash tag, so its keys would
/// land on different cluster slots.
pub(crate) fn key_pair(prefix: &str, key: &str) -> Result<KeyPair, BackendError> {
    if key.contains(['{', '}']) {
        return Err(BackendError::new(format!(
            "state key {key:?} contains a brace: build keys with broker_core::keys"
        )));
    }
    if key.is_empty() {
        return Err(BackendError::new(
            "the state key is empty: it would give no hash tag (CROSSSLOT on Redis Cluster)",
        ));
    }
    Ok(KeyPair {
        buckets: format!("{prefix}:{{{key}}}:b"),
        leases: format!("{prefix}:{{{key}}}:l"),
    })
}

/// The turn ledger of state `key` at priority `level` (see
/// `lua/turn.lua`): `prefix:{key}:t<level>v` and `:t<level>s`.
pub(crate) fn turn_keys(prefix: &str, key: &str, level: u8) -> Result<[String; 2], BackendError> {
    let pair = key_pair(prefix, key)?;
    let stem = pair.buckets.strip_suffix('b').unwrap_or(&pair.buckets);
    Ok([format!("{stem}t{level}v"), format!("{stem}t{level}s")])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_keys_share_one_hash_tag() {
        let k = key_pair("rb", "tenants:acme").unwrap();
        assert_eq!(k.buckets, "rb:{tenants:acme}:b");
        assert_eq!(k.leases, "rb:{tenants:acme}:l");
    }

    /// On Redis Cluster both keys of a state hash to one slot (the hash
    /// tag's), whatever the key; an empty key, which has no hash tag, is
    /// refused.
    #[cfg(feature = "cluster")]
    #[test]
    fn both_keys_land_on_one_cluster_slot() {
        use redis::cluster_routing::Slot;
        let long = "t".repeat(10_000);
        let keys = [
            "a",
            "tenants:acme",
            &broker_core::keys::keyed("a:b{c}", "d e\u{e9}"),
            &broker_core::keys::keyed("api", ""),
            &long,
        ];
        for key in keys {
            let k = key_pair("rb", key).unwrap();
            assert_eq!(
                Slot::for_key(&k.buckets),
                Slot::for_key(&k.leases),
                "{key:?}"
            );
        }
        assert!(key_pair("rb", "").is_err());
        assert!(key_pair("", "").is_err());
    }

    #[test]
    fn turn_keys_share_the_states_hash_tag() {
        let [v, s] = turn_keys("rb", "tenants:acme", 2).unwrap();
        assert_eq!(v, "rb:{tenants:acme}:t2v");
        assert_eq!(s, "rb:{tenants:acme}:t2s");
        assert!(turn_keys("rb", "a}b", 0).is_err());
    }

    #[test]
    fn braces_are_refused_in_keys_and_prefixes() {
        assert!(key_pair("rb", "a}b").is_err());
        assert!(check_prefix("r{b").is_err());
        assert!(check_prefix("app:rb").is_ok());
    }
}
