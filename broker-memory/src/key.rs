//! The key of a state: its resource part and its sub-key. Local calls name
//! the two parts; keyed calls a joined state key, parsed here into them.

use std::borrow::{Borrow, Cow};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use broker_core::keys;

/// Which state of a resource part a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Sub {
    /// The resource's own state (a state key without `:`).
    Own,
    /// A sub-key: the state key `resource:escape(sub)`.
    Raw,
    /// A state key whose part after the first `:` is no output of
    /// [`keys::escape`]: kept as it is, apart from every `Raw` key.
    Opaque,
}

/// A key as the table holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StateKey {
    resource: Arc<str>,
    kind: Sub,
    sub: Box<str>,
}

/// A key to look up, borrowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRef<'a> {
    pub(crate) resource: &'a str,
    pub(crate) kind: Sub,
    /// The sub-key (empty for [`Sub::Own`]).
    pub(crate) sub: &'a str,
}

/// The parts of a key: the table holds [`StateKey`]s and is searched with a
/// [`KeyRef`] as a `dyn Parts`, so a lookup builds no key. Hashed and
/// compared as [`StateKey`] derives it.
pub(crate) trait Parts {
    fn parts(&self) -> KeyRef<'_>;
}

impl Parts for StateKey {
    fn parts(&self) -> KeyRef<'_> {
        KeyRef {
            resource: &self.resource,
            kind: self.kind,
            sub: &self.sub,
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
        let k = self.parts();
        k.resource.hash(h);
        k.kind.hash(h);
        k.sub.hash(h);
    }
}

impl PartialEq for dyn Parts + '_ {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.parts(), other.parts());
        a.kind == b.kind && a.sub == b.sub && a.resource == b.resource
    }
}

impl Eq for dyn Parts + '_ {}

impl StateKey {
    pub(crate) fn resource(&self) -> &Arc<str> {
        &self.resource
    }

    pub(crate) fn is_own(&self) -> bool {
        self.kind == Sub::Own
    }
}

impl<'a> KeyRef<'a> {
    /// The key of sub-key `sub` (`None`: the own state) of the resource
    /// whose state key is `resource`.
    pub(crate) fn local(resource: &'a str, sub: Option<&'a str>) -> Self {
        Self {
            resource,
            kind: if sub.is_some() { Sub::Raw } else { Sub::Own },
            sub: sub.unwrap_or(""),
        }
    }

    /// The owned key, sharing `resource` when it is the resource part.
    pub(crate) fn to_owned_with(self, resource: Option<&Arc<str>>) -> StateKey {
        let resource = match resource {
            Some(r) if **r == *self.resource => r.clone(),
            _ => Arc::from(self.resource),
        };
        StateKey {
            resource,
            kind: self.kind,
            sub: self.sub.into(),
        }
    }
}

/// A joined state key split into its parts: before the first `:`, the
/// resource part; the rest unescaped when it is an escaped sub-key, else
/// opaque. Two different state keys never parse to the same parts.
pub(crate) fn parse(key: &str) -> (&str, Sub, Cow<'_, str>) {
    match key.split_once(':') {
        None => (key, Sub::Own, Cow::Borrowed("")),
        Some((resource, rest)) => match keys::unescape(rest) {
            Some(raw) => (resource, Sub::Raw, raw),
            None => (resource, Sub::Opaque, Cow::Borrowed(rest)),
        },
    }
}

/// Runs `f` on the key of the joined state key `key`.
pub(crate) fn with_parsed<R>(key: &str, f: impl FnOnce(KeyRef<'_>) -> R) -> R {
    let (resource, kind, sub) = parse(key);
    f(KeyRef {
        resource,
        kind,
        sub: &sub,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::keys::keyed;

    fn parts(key: &str) -> (String, Sub, String) {
        with_parsed(key, |k| (k.resource.to_owned(), k.kind, k.sub.to_owned()))
    }

    #[test]
    fn a_keyed_state_key_parses_to_its_sub_key() {
        let part = |r: &str, kind, s: &str| (r.to_owned(), kind, s.to_owned());
        assert_eq!(parts(&keyed("api", "a:b")), part("api", Sub::Raw, "a:b"));
        assert_eq!(parts(&keyed("a:b", "c")), part("a%3Ab", Sub::Raw, "c"));
        assert_eq!(parts("api"), part("api", Sub::Own, ""));
        assert_eq!(parts("api:"), part("api", Sub::Raw, ""));
        assert_eq!(parts("api:x:y"), part("api", Sub::Opaque, "x:y"));
        assert_eq!(parts("api:%41"), part("api", Sub::Opaque, "%41"));
    }

    #[test]
    fn a_state_made_by_sub_key_is_found_by_its_joined_key_and_back() {
        let states = crate::states::States::new();
        let spec = Arc::new(broker_core::LimitSpec::new(
            &broker_core::Limits::new().rate(broker_core::RateLimit::per_second(1)),
            std::time::Duration::from_secs(1),
        ));
        let entry = |_| crate::states::Entry::new(spec.clone(), &spec, 0);
        let resource: Arc<str> = Arc::from("api");
        let long = "a sub-key longer than the inline twenty-two bytes";
        for (n, sub) in ["t-1", "a:b", "", "%", long].into_iter().enumerate() {
            let local = KeyRef::local(&resource, Some(sub));
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
        let own = KeyRef::local(&resource, None);
        assert!(states.get(own).is_none());
        let (_, inserted) = with_parsed("api", |k| {
            states.upsert(k, || k.to_owned_with(None), entry, |_| ())
        });
        assert!(inserted);
        assert!(states.get(own).is_some());
    }
}
