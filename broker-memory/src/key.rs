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
pub(crate) enum Sub {
    /// The resource's own state (a state key without `:`).
    Own,
    /// A sub-key: the state key `resource:escape(sub)`.
    Raw,
    /// A state key whose part after the first `:` is no output of
    /// [`keys::escape`] (not built by the broker): kept as it is, apart
    /// from every `Raw` key.
    Opaque,
}

/// A key as stored in the table.
#[derive(Debug, Clone)]
pub(crate) struct StateKey {
    resource: Arc<str>,
    sub: SubBytes,
    kind: Sub,
}

/// The bytes of a sub-key, inline when short (the common case), so a
/// lookup compares them without following a pointer.
#[derive(Debug, Clone)]
enum SubBytes {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

/// Longest sub-key held inline.
const INLINE: usize = 22;

impl SubBytes {
    fn new(sub: &[u8]) -> Self {
        let mut bytes = [0; INLINE];
        match bytes.get_mut(..sub.len()) {
            Some(head) => {
                head.copy_from_slice(sub);
                Self::Inline {
                    len: sub.len() as u8,
                    bytes,
                }
            }
            None => Self::Heap(sub.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..*len as usize],
            Self::Heap(b) => b,
        }
    }
}

/// A key to look up, borrowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRef<'a> {
    pub(crate) resource: &'a str,
    /// [`resource_hash`] of `resource`.
    pub(crate) resource_hash: u64,
    pub(crate) kind: Sub,
    /// The sub-key's bytes (empty for [`Sub::Own`]).
    pub(crate) sub: &'a [u8],
}

/// A fixed hash of a resource part, computed once per resource on the
/// fast path, so a lookup feeds the table's hasher one word and the
/// sub-key.
pub(crate) fn resource_hash(resource: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x5eed).hash_one(resource)
}

impl StateKey {
    /// Whether this is the key `key` names. Inlined into the table's
    /// probe: out of line it was a call per probed slot.
    #[inline(always)]
    pub(crate) fn is(&self, key: KeyRef<'_>) -> bool {
        // The fast path's keys share the resource's allocation.
        let same_resource =
            std::ptr::eq(&*self.resource, key.resource) || *self.resource == *key.resource;
        same_resource && self.kind == key.kind && keys::same(self.sub.as_bytes(), key.sub)
    }

    /// The resource part.
    pub(crate) fn resource(&self) -> &Arc<str> {
        &self.resource
    }

    /// The key as a lookup would name it (hashing the resource part again).
    pub(crate) fn as_ref(&self) -> KeyRef<'_> {
        KeyRef {
            resource: &self.resource,
            resource_hash: resource_hash(&self.resource),
            kind: self.kind,
            sub: self.sub.as_bytes(),
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
            kind: if sub.is_some() { Sub::Raw } else { Sub::Own },
            sub: sub.map_or(&[], str::as_bytes),
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
            sub: SubBytes::new(self.sub),
            kind: self.kind,
        }
    }
}

/// A joined state key, split into its parts: the part before the first
/// `:` is the resource part; the rest is unescaped when it is exactly an
/// escaped sub-key (as [`keys::keyed`] builds), else kept opaque. One to
/// one: two different state keys never parse to the same parts.
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
        resource_hash: resource_hash(resource),
        kind,
        sub: sub.as_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::keys::keyed;

    fn parts(key: &str) -> (String, Sub, String) {
        with_parsed(key, |k| {
            let sub = String::from_utf8(k.sub.to_vec()).unwrap();
            (k.resource.to_owned(), k.kind, sub)
        })
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
        let states = crate::States::new();
        let spec = std::sync::Arc::new(broker_core::LimitSpec::new(
            &broker_core::Limits::new().rate(broker_core::RateLimit::per_second(1)),
            std::time::Duration::from_secs(1),
        ));
        let entry = |_| crate::Entry {
            state: crate::Slot::Table(crate::Stored::full(
                broker_core::state::ResourceState::fresh(&spec, 0),
            )),
            spec: spec.clone(),
        };
        let resource: Arc<str> = Arc::from("api");
        let hash = resource_hash(&resource);
        let long = "a sub-key longer than the inline twenty-two bytes";
        for (n, sub) in ["t-1", "a:b", "", "%", long].into_iter().enumerate() {
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
