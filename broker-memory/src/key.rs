//! The key of a state in the map: the resource part of its state key and
//! the sub-key as the caller gave it, so the broker's calls through
//! [`LocalStates`](broker_core::LocalStates) find a state by its two parts
//! without joining and escaping them, and the keyed [`Backend`] calls find
//! the same state by parsing the joined key.
//!
//! [`Backend`]: broker_core::Backend

use std::borrow::Cow;
use std::sync::Arc;

use broker_core::keys;

/// Which state of a resource part a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sub<S> {
    /// The resource's own state (a state key without `:`).
    Own,
    /// Sub-key `k`: the state key `resource:escape(k)`.
    Raw(S),
    /// A state key whose part after the first `:` is no output of
    /// [`keys::escape`] (not built by the broker): kept as it is, apart
    /// from every `Raw` key.
    Opaque(S),
}

/// A key as stored in the map.
#[derive(Debug, Clone)]
pub(crate) struct StateKey {
    resource: Arc<str>,
    /// [`resource_hash`] of `resource`.
    resource_hash: u64,
    sub: Sub<Box<str>>,
}

/// A key to look up, borrowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRef<'a> {
    pub(crate) resource: &'a str,
    /// [`resource_hash`] of `resource`.
    pub(crate) resource_hash: u64,
    pub(crate) sub: Sub<&'a str>,
}

/// A fixed hash of a resource part, computed once per resource on the
/// fast path, so a lookup feeds the table's hasher one word and the
/// sub-key.
pub(crate) fn resource_hash(resource: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x5eed).hash_one(resource)
}

impl PartialEq for KeyRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        // The fast path's keys share the resource's allocation.
        let same_resource = std::ptr::eq(self.resource, other.resource)
            || (self.resource_hash == other.resource_hash && self.resource == other.resource);
        same_resource
            && match (self.sub, other.sub) {
                (Sub::Own, Sub::Own) => true,
                (Sub::Raw(a), Sub::Raw(b)) | (Sub::Opaque(a), Sub::Opaque(b)) => {
                    keys::same(a.as_bytes(), b.as_bytes())
                }
                _ => false,
            }
    }
}

impl StateKey {
    pub(crate) fn as_ref(&self) -> KeyRef<'_> {
        KeyRef {
            resource: &self.resource,
            resource_hash: self.resource_hash,
            sub: match &self.sub {
                Sub::Own => Sub::Own,
                Sub::Raw(s) => Sub::Raw(s),
                Sub::Opaque(s) => Sub::Opaque(s),
            },
        }
    }
}

impl<'a> KeyRef<'a> {
    /// The key of sub-key `sub` (`None`: the own state) of the resource
    /// whose state key is `resource`.
    pub(crate) fn local(resource: &'a str, resource_hash: u64, sub: Option<&'a str>) -> Self {
        Self {
            resource,
            resource_hash,
            sub: sub.map_or(Sub::Own, Sub::Raw),
        }
    }

    /// The owned key, sharing `resource` when it is the resource part.
    pub(crate) fn to_owned_with(self, resource: Option<&Arc<str>>) -> StateKey {
        let resource = match resource {
            Some(r) if **r == *self.resource => r.clone(),
            _ => Arc::from(self.resource),
        };
        let sub = match self.sub {
            Sub::Own => Sub::Own,
            Sub::Raw(s) => Sub::Raw(s.into()),
            Sub::Opaque(s) => Sub::Opaque(s.into()),
        };
        StateKey {
            resource,
            resource_hash: self.resource_hash,
            sub,
        }
    }
}

/// A joined state key, split into its parts: the part before the first
/// `:` is the resource part; the rest is unescaped when it is exactly an
/// escaped sub-key (as [`keys::keyed`] builds), else kept opaque. One to
/// one: two different state keys never parse to the same parts.
pub(crate) fn parse(key: &str) -> (&str, Sub<Cow<'_, str>>) {
    match key.split_once(':') {
        None => (key, Sub::Own),
        Some((resource, rest)) => match keys::unescape(rest) {
            Some(raw) => (resource, Sub::Raw(raw)),
            None => (resource, Sub::Opaque(Cow::Borrowed(rest))),
        },
    }
}

/// Runs `f` on the key of the joined state key `key`.
pub(crate) fn with_parsed<R>(key: &str, f: impl FnOnce(KeyRef<'_>) -> R) -> R {
    let (resource, sub) = parse(key);
    let sub = match &sub {
        Sub::Own => Sub::Own,
        Sub::Raw(s) => Sub::Raw(s.as_ref()),
        Sub::Opaque(s) => Sub::Opaque(s.as_ref()),
    };
    f(KeyRef {
        resource,
        resource_hash: resource_hash(resource),
        sub,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::keys::keyed;

    fn parts(key: &str) -> (String, Sub<String>) {
        with_parsed(key, |k| {
            let sub = match k.sub {
                Sub::Own => Sub::Own,
                Sub::Raw(s) => Sub::Raw(s.to_owned()),
                Sub::Opaque(s) => Sub::Opaque(s.to_owned()),
            };
            (k.resource.to_owned(), sub)
        })
    }

    #[test]
    fn a_keyed_state_key_parses_to_its_sub_key() {
        assert_eq!(
            parts(&keyed("api", "a:b")),
            ("api".into(), Sub::Raw("a:b".into()))
        );
        assert_eq!(
            parts(&keyed("a:b", "c")),
            ("a%3Ab".into(), Sub::Raw("c".into()))
        );
        assert_eq!(parts("api"), ("api".into(), Sub::Own));
        assert_eq!(parts("api:"), ("api".into(), Sub::Raw(String::new())));
        assert_eq!(parts("api:x:y"), ("api".into(), Sub::Opaque("x:y".into())));
        assert_eq!(parts("api:%41"), ("api".into(), Sub::Opaque("%41".into())));
    }

    #[test]
    fn a_state_made_by_sub_key_is_found_by_its_joined_key_and_back() {
        let states = crate::States::new();
        let spec = std::sync::Arc::new(broker_core::LimitSpec::new(
            &broker_core::Limits::new().rate(broker_core::RateLimit::per_second(1)),
            std::time::Duration::from_secs(1),
        ));
        let entry = || crate::Entry {
            state: broker_core::state::ResourceState::fresh(&spec, 0),
            spec: spec.clone(),
        };
        let resource: Arc<str> = Arc::from("api");
        let hash = resource_hash(&resource);
        for (n, sub) in ["t-1", "a:b", "", "%"].into_iter().enumerate() {
            let local = KeyRef::local(&resource, hash, Some(sub));
            let (_, inserted) = states.upsert(
                local,
                || local.to_owned_with(Some(&resource)),
                entry,
                |_| (),
            );
            assert!(inserted);
            let joined = keyed("api", sub);
            let (_, inserted) = with_parsed(&joined, |k| {
                states.upsert(k, || k.to_owned_with(None), entry, |_| ())
            });
            assert!(!inserted, "{joined} is the state of sub-key {sub:?}");
            assert_eq!(states.len(), n + 1);
        }
        // An opaque key is a state of its own.
        let (_, inserted) = with_parsed("api:a:b", |k| {
            states.upsert(k, || k.to_owned_with(None), entry, |_| ())
        });
        assert!(inserted);
        let own = KeyRef::local(&resource, hash, None);
        assert!(states.get(own, |_| ()).is_none());
        assert!(
            with_parsed("api", |k| states.upsert(
                k,
                || k.to_owned_with(None),
                entry,
                |_| ()
            ))
            .1
        );
        assert!(states.get(own, |_| ()).is_some());
    }
}
