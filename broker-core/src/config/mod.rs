//! Loading JSON, YAML and TOML config documents; errors name the source and
//! the path inside it.

mod named_fields;
mod unique_keys;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_norway::Deserializer as Yaml;

use crate::error::ConfigError;
pub use crate::model::resource_config::ResourceConfig;

/// The document formats [`parse`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
    /// TOML.
    Toml,
}

/// Parses `text` (named `source_name` in errors) into `T`. Errors carry the
/// path inside the document, e.g. `pressure.perRoute[1].limits.requestsPerSecond`.
///
/// ```
/// use broker_core::config::{parse, Format};
/// use broker_core::Limits;
/// let err = parse::<Limits>("limits.json", r#"{"rates":[{"amount":5,"period":"1s","burst":0}]}"#, Format::Json)
///     .unwrap_err();
/// assert!(err.to_string().starts_with("limits.json: "), "{err}");
/// assert!(err.to_string().contains("burst"), "{err}");
/// ```
pub fn parse<T: DeserializeOwned>(
    source_name: &str,
    text: &str,
    format: Format,
) -> Result<T, ConfigError> {
    // serde reads a list as a struct's fields in order: read JSON and TOML
    // again as a tree to refuse that (YAML's reader refuses it itself).
    let (parsed, tree) = match format {
        Format::Json => (tree(source_name, text), serde_json::from_str(text).ok()),
        Format::Yaml => (read(source_name, Yaml::from_str(text)), None),
        Format::Toml => (
            read(source_name, toml::Deserializer::new(text)),
            toml::from_str(text).ok(),
        ),
    };
    if let Some(Err(e)) = tree.map(|tree: serde_json::Value| from_value::<T>(&tree)) {
        if named_fields::refuses_a_list(e.inner()) {
            return Err(parse_error(source_name, located(&e)));
        }
    }
    let parsed = parsed?;
    match format {
        Format::Json => refuse_repeated_keys(source_name, text)?,
        Format::Yaml => match unique_keys::UniqueKeys::deserialize(Yaml::from_str(text)) {
            Err(e) if unique_keys::refuses_a_repeated_key(&e.to_string()) => {
                return Err(parse_error(source_name, e.to_string()));
            }
            _ => {}
        },
        // TOML's reader refuses a repeated key itself.
        Format::Toml => {}
    }
    Ok(parsed)
}

/// Refuses a JSON document with a key written twice in one object;
/// [`parse`] runs it already.
///
/// ```
/// use broker_core::config::refuse_repeated_keys;
/// assert!(refuse_repeated_keys("ok.json", r#"{"a": {"x": 1}, "b": {"x": 1}}"#).is_ok());
/// let e = refuse_repeated_keys("twice.json", r#"{"services": {"rest": 1, "rest": 2}}"#)
///     .unwrap_err();
/// assert!(e.to_string().contains("at services: the key `rest` is written twice"), "{e}");
/// ```
pub fn refuse_repeated_keys(source_name: &str, text: &str) -> Result<(), ConfigError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    read::<_, unique_keys::UniqueKeys>(source_name, de).map(|_| ())
}

/// Reads `T` from `de`; an error names the source and the path.
fn read<'de, D, T>(source_name: &str, de: D) -> Result<T, ConfigError>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    serde_path_to_error::deserialize(de).map_err(|e| parse_error(source_name, located(&e)))
}

fn parse_error(source_name: &str, message: String) -> ConfigError {
    ConfigError::Parse {
        source_name: source_name.to_owned(),
        message,
    }
}

/// An error's message with the path it is at, if any.
fn located<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>) -> String {
    match e.path().to_string() {
        path if path.is_empty() || path == "." => e.inner().to_string(),
        path => format!("at {path}: {}", e.inner()),
    }
}

/// Reads `T` (a [`serde_json::Value`] tree, say) from a JSON document,
/// refusing trailing text; an error names its path.
///
/// ```
/// let e = broker_core::config::tree::<serde_json::Value>("kb.json", r#"{"a": [{"b": 1e400}]}"#)
///     .unwrap_err();
/// assert!(e.to_string().starts_with("kb.json: at a[0].b: number out of range"), "{e}");
/// ```
pub fn tree<T: DeserializeOwned>(source_name: &str, text: &str) -> Result<T, ConfigError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let value = read(source_name, &mut *de)?;
    de.end()
        .map_err(|e| parse_error(source_name, e.to_string()))?;
    Ok(value)
}

/// Reads `T` from a JSON tree, every struct from an object only (a list
/// where a struct stands is an error at its path).
///
/// ```
/// use broker_core::config::from_value;
/// use broker_core::RateLimit;
/// let tree = serde_json::json!({"amount": 5, "period": "1s"});
/// assert_eq!(from_value::<RateLimit>(&tree).unwrap(), RateLimit::per_second(5));
/// let listed = serde_json::json!([[5, "1s"]]);
/// let e = from_value::<Vec<RateLimit>>(&listed).unwrap_err();
/// assert_eq!(e.path().to_string(), "[0]");
/// assert!(e.inner().to_string().contains("an object with named fields"));
/// ```
pub fn from_value<T: DeserializeOwned>(
    tree: &serde_json::Value,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(named_fields::NamedFields(tree))
}
