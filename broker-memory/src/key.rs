//! The key of a state: its resource part and its sub-key. Local calls name
//! the two parts; keyed calls a joined state key, parsed here into them.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use broker_core::keys;

/// A key as the table holds it (hashed and compared as its [`KeyRef`]).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct StateKey {
    pub(crate) resource: Arc<str>,
    pub(crate) sub: Option<Box<str>>,
}

/// A key to look up, borrowed: `sub` is `None` for the resource's own state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyRef<'a> {
    pub(crate) resource: &'a str,
    pub(crate) sub: Option<&'a str>,
}

/// The parts of a key: the table holds [`StateKey`]s and is searched with a
/// [`KeyRef`] as a `dyn Parts`, so a lookup builds no key.
pub(crate) trait Parts {
    fn parts(&self) -> KeyRef<'_>;
}

impl Parts for StateKey {
    fn parts(&self) -> KeyRef<'_> {
        KeyRef {
            resource: &self.resource,
            sub: self.sub.as_deref(),
        }
    }
}

impl Parts for KeyRef<'_> {
    fn parts(&self) -> KeyRef<'_> {
        *self
    }
}

impl<'a> Borrow<dyn Parts + 'a> for StateKey {
    fn borrow(&self) -> &(dyn Parts + 'a) {
        self
    }
}

impl Hash for dyn Parts + '_ {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.parts().hash(h);
    }
}

impl PartialEq for dyn Parts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn Parts + '_ {}

impl KeyRef<'_> {
    /// The owned key, sharing `resource` (the resource part) when given.
    pub(crate) fn to_owned_with(self, resource: Option<&Arc<str>>) -> StateKey {
        debug_assert!(resource.is_none_or(|r| **r == *self.resource));
        StateKey {
            resource: resource.map_or_else(|| Arc::from(self.resource), Arc::clone),
            sub: self.sub.map(Box::from),
        }
    }
}

/// Runs `f` on `key` split at its first `:` and unescaped; a rest that
/// [`keys::escape`] never outputs makes the whole key the resource part.
pub(crate) fn with_parsed<R>(key: &str, f: impl FnOnce(KeyRef<'_>) -> R) -> R {
    let (resource, sub) = match key.split_once(':') {
        None => (key, None),
        Some((resource, rest)) => match keys::unescape(rest) {
            Some(sub) => (resource, Some(sub)),
            None => (key, None),
        },
    };
    f(KeyRef {
        resource,
        sub: sub.as_deref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Entry, Store};
    use broker_core::keys::keyed;

    fn parts(key: &str) -> (String, Option<String>) {
        with_parsed(key, |k| (k.resource.to_owned(), k.sub.map(str::to_owned)))
    }

    #[test]
    fn a_keyed_state_key_parses_to_its_sub_key() {
        let part = |r: &str, s: Option<&str>| (r.to_owned(), s.map(str::to_owned));
        assert_eq!(parts(&keyed("api", "a:b")), part("api", Some("a:b")));
        assert_eq!(parts(&keyed("a:b", "c")), part("a%3Ab", Some("c")));
        assert_eq!(parts("api"), part("api", None));
        assert_eq!(parts("api:"), part("api", Some("")));
        // Opaque: the whole key is a resource part of its own.
        assert_eq!(parts("api:x:y"), part("api:x:y", None));
        assert_eq!(parts("api:%41"), part("api:%41", None));
    }

    #[test]
    fn a_state_made_by_sub_key_is_found_by_its_joined_key_and_back() {
        let store = Store::new(Arc::new(broker_core::ManualClock::new()));
        let spec = Arc::new(broker_core::LimitSpec::new(
            &broker_core::Limits::new().rate(broker_core::RateLimit::per_second(1)),
            std::time::Duration::from_secs(1),
        ));
        let upsert = |k: KeyRef<'_>, resource: Option<&Arc<str>>| {
            let inserted = store.map.get(&k as &dyn Parts).is_none();
            let state = broker_core::state::ResourceState::fresh(&spec, 0);
            let entry = Entry {
                spec: spec.clone(),
                state,
            };
            store
                .map
                .entry(k.to_owned_with(resource))
                .or_insert(entry.into());
            inserted
        };
        let resource: Arc<str> = Arc::from("api");
        let long = "a sub-key longer than the inline twenty-two bytes";
        for (n, sub) in ["t-1", "a:b", "", "%", long].into_iter().enumerate() {
            let local = KeyRef {
                resource: &resource,
                sub: Some(sub),
            };
            assert!(upsert(local, Some(&resource)));
            let joined = keyed("api", sub);
            let inserted = with_parsed(&joined, |k| upsert(k, None));
            assert!(!inserted, "{joined} is the state of sub-key {sub:?}");
            assert_eq!(store.map.len(), n + 1);
        }
        // An opaque key is a state of its own.
        assert!(with_parsed("api:a:b", |k| upsert(k, None)));
        let own = KeyRef {
            resource: &resource,
            sub: None,
        };
        assert!(store.map.get(&own as &dyn Parts).is_none());
        assert!(with_parsed("api", |k| upsert(k, None)));
        assert!(store.map.get(&own as &dyn Parts).is_some());
    }
}
