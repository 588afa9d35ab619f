//! [`UniqueKeys`]: reads a JSON or YAML document only to refuse a mapping
//! with a key written twice (readers silently keep the last one).

use std::collections::HashSet;
use std::fmt;

use serde::de::{
    self, Deserialize, Deserializer, EnumAccess, IgnoredAny, MapAccess, SeqAccess, VariantAccess,
    Visitor,
};

/// Any JSON or YAML value, read only to find a mapping with a repeated
/// key (an error at that mapping's path).
pub(crate) struct UniqueKeys;

/// What the refusal of a repeated key says of it.
const TWICE: &str = "is written twice";

/// Whether `message` is the refusal of a repeated key (not a non-text key).
pub(crate) fn refuses_a_repeated_key(message: &str) -> bool {
    message.contains(TWICE)
}

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeys)
    }
}

/// Visits that accept a scalar (or a unit, or an empty YAML document) as it is.
macro_rules! scalars {
    ($($visit:ident($($t:ty)?)),*) => {$(
        fn $visit<E>(self $(, _: $t)?) -> Result<UniqueKeys, E> {
            Ok(UniqueKeys)
        }
    )*};
}

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON or YAML value")
    }

    scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_str(&str),
        visit_i128(i128),
        visit_u128(u128),
        visit_bytes(&[u8]),
        visit_unit(),
        visit_none()
    );

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<UniqueKeys, D::Error> {
        UniqueKeys::deserialize(d)
    }

    /// A YAML value with a tag (`!name value`): the value is read.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<UniqueKeys, A::Error> {
        let (IgnoredAny, value) = data.variant::<IgnoredAny>()?;
        value.newtype_variant::<UniqueKeys>()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    /// Keys are read as written (`1` and `"1"` are one name, `1.1` and
    /// `1.10` two); a key with no text (`? [a, b]`) is an error.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if let Some(key) = seen.replace(key) {
                return Err(de::Error::custom(format_args!("the key `{key}` {TWICE}")));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), String> {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize::<_, UniqueKeys>(de)
            .map(|_| ())
            .map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }

    #[test]
    fn a_key_written_twice_is_refused_at_its_object() {
        assert_eq!(
            check(r#"{"a": 1, "b": [true, null, "x", 2.5, -3]}"#),
            Ok(())
        );
        let e = check(r#"{"s": {"rest": {"n": 1}, "rest": {"n": 2}}}"#).unwrap_err();
        assert!(e.starts_with("s: the key `rest` is written twice"), "{e}");
        let e = check(r#"[{"a": 1}, {"a": 1, "a": 1}]"#).unwrap_err();
        assert!(e.contains("the key `a` is written twice"), "{e}");
        // The same key in two objects is not repeated.
        assert_eq!(check(r#"{"x": {"a": 1}, "y": {"a": 1}}"#), Ok(()));
    }

    #[test]
    fn a_yaml_key_written_twice_is_refused_and_other_documents_read() {
        let check = |text: &str| {
            let de = serde_norway::Deserializer::from_str(text);
            serde_path_to_error::deserialize::<_, UniqueKeys>(de)
                .map(|_| ())
                .map_err(|e| format!("{}: {}", e.path(), e.inner()))
        };
        let e = check("s:\n  rest: 1\n  rest: 2\n").unwrap_err();
        assert!(e.starts_with("s: "), "{e}");
        assert!(e.contains("the key `rest` is written twice"), "{e}");
        // A quoted and a plain string are one key.
        let e = check("\"a\": 1\na: 2\n").unwrap_err();
        assert!(e.contains("the key `a` is written twice"), "{e}");
        for fine in [
            "a: 1\nb: [x, {c: 2}]\n1: one\n",
            // Number keys are names as written: not compared.
            "1.1: a\n1.10: b\n0x10: c\n16: d\n",
            "123456789012345678901234: big\n",
            "mode: !skip_and_reschedule\nother: !tag {a: 1}\n",
            "# nothing yet\n",
            "",
        ] {
            assert_eq!(check(fine), Ok(()), "{fine:?}");
        }
        // A number, boolean or null key written twice as the same text is
        // one name twice, as is a plain key and its quoted text.
        for twice in [
            "1: a\n1: b\n",
            "1: a\n\"1\": b\n",
            "true: a\n\"true\": b\n",
            "~: a\n~: b\n",
        ] {
            let e = check(twice).unwrap_err();
            assert!(refuses_a_repeated_key(&e), "{twice:?}: {e}");
        }
        // A key with no text stops the check, without a refusal.
        let e = check("? [a, b]\n: complex\n").unwrap_err();
        assert!(!refuses_a_repeated_key(&e), "{e}");
    }
}
