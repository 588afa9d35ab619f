//! [`NamedFields`]: a [`serde_json::Value`] read with every struct from an
//! object only, so `[5, "1s", 10]` cannot pass for a rate with its fields
//! swapped; a list where a struct stands is an error at its path.

use serde::de::value::{MapAccessDeserializer, MapDeserializer, SeqDeserializer};
use serde::de::{self, Error as _, IntoDeserializer, Unexpected, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::Value;

/// What a struct is read from.
const EXPECTED: &str = "an object with named fields";

/// Whether `e` is the refusal of a list where a struct stands.
pub(crate) fn refuses_a_list(e: &serde_json::Error) -> bool {
    e.to_string().contains(EXPECTED)
}

/// A [`Value`] as a deserializer whose structs come from objects only.
pub(crate) struct NamedFields<'a>(pub(crate) &'a Value);

impl<'de> de::Deserializer<'de> for NamedFields<'_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(items) => {
                visitor.visit_seq(SeqDeserializer::new(items.iter().map(NamedFields)))
            }
            Value::Object(map) => {
                let entries = map.iter().map(|(k, v)| (k.as_str(), NamedFields(v)));
                visitor.visit_map(MapDeserializer::new(entries))
            }
            scalar => scalar.clone().deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_map(visitor)
    }

    /// A map, a struct or a struct variant: from an object, never a list.
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(_) => Err(Self::Error::invalid_type(Unexpected::Seq, &EXPECTED)),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    /// An enum is a variant name, or an object with one entry: the variant
    /// and its value.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        if let Some(map) = self.0.as_object().filter(|map| map.len() == 1) {
            let entry = map.iter().map(|(k, v)| (k.as_str(), NamedFields(v)));
            return visitor.visit_enum(MapAccessDeserializer::new(MapDeserializer::new(entry)));
        }
        self.0.clone().deserialize_enum(name, variants, visitor)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct identifier
        ignored_any
    }
}

impl<'de, 'a> IntoDeserializer<'de, serde_json::Error> for NamedFields<'a> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rate {
        amount: u64,
        burst: Option<u64>,
        unit: Unit,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Unit {
        Requests,
        Tokens,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    enum Shape {
        Fixed { every: u64 },
        Pair(u64, u64),
        One(u64),
        None,
    }

    fn read<T: de::DeserializeOwned>(json: &str) -> Result<T, String> {
        let value: Value = serde_json::from_str(json).unwrap();
        serde_path_to_error::deserialize(NamedFields(&value))
            .map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }

    #[test]
    fn objects_read_as_from_the_value_and_lists_are_refused_where_a_struct_stands() {
        let rate = r#"{"amount": 5, "burst": null, "unit": "tokens"}"#;
        assert_eq!(
            read::<Rate>(rate).unwrap(),
            Rate {
                amount: 5,
                burst: None,
                unit: Unit::Tokens
            }
        );
        assert_eq!(
            read::<Vec<Rate>>(r#"[{"amount": 1, "burst": 2, "unit": "requests"}]"#).unwrap(),
            [Rate {
                amount: 1,
                burst: Some(2),
                unit: Unit::Requests
            }]
        );
        // serde_json itself reads the list by position.
        assert!(serde_json::from_str::<Rate>(r#"[5, 10, "tokens"]"#).is_ok());
        let e = read::<Vec<Rate>>(r#"[[5, 10, "tokens"]]"#).unwrap_err();
        assert!(
            e.starts_with("[0]: invalid type: sequence, expected an object"),
            "{e}"
        );
        let e = read::<Rate>(r#"{"amount": -1, "burst": null, "unit": "tokens"}"#).unwrap_err();
        assert!(e.starts_with("amount: invalid value: integer `-1`"), "{e}");
        let e = read::<Rate>(r#"{"amount": 1, "unit": "tokens", "extra": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `extra`"), "{e}");
    }

    #[test]
    fn enums_read_from_a_name_or_an_object_of_one_variant() {
        assert_eq!(read::<Shape>(r#""None""#).unwrap(), Shape::None);
        assert_eq!(read::<Shape>(r#"{"One": 3}"#).unwrap(), Shape::One(3));
        assert_eq!(
            read::<Shape>(r#"{"Pair": [1, 2]}"#).unwrap(),
            Shape::Pair(1, 2)
        );
        assert_eq!(
            read::<Shape>(r#"{"Fixed": {"every": 4}}"#).unwrap(),
            Shape::Fixed { every: 4 }
        );
        let e = read::<Shape>(r#"{"Fixed": [4]}"#).unwrap_err();
        assert!(e.contains("expected an object with named fields"), "{e}");
        assert!(read::<Shape>(r#"{"One": 1, "None": null}"#).is_err());
    }
}
