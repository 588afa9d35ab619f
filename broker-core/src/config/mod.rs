//! Loading config documents: JSON, YAML and TOML load into the model's
//! types ([`LimitsConfig`], [`ResourceConfig`], ...); errors name the
//! source, the path inside it and what is wrong.

mod named_fields;
mod unique_keys;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ConfigError;
pub use crate::model::limits::LimitsConfig;
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

impl Format {
    /// The format implied by a file name's extension (JSON otherwise).
    pub fn from_path(path: &str) -> Self {
        if path.ends_with(".yaml") || path.ends_with(".yml") {
            Format::Yaml
        } else if path.ends_with(".toml") {
            Format::Toml
        } else {
            Format::Json
        }
    }
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
    let fail = |message: String| ConfigError::Parse {
        source_name: source_name.to_owned(),
        message,
    };
    let parsed = match format {
        Format::Json => {
            let de = &mut serde_json::Deserializer::from_str(text);
            let parsed = serde_path_to_error::deserialize(&mut *de)
                .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())));
            // Text after the value (an object closed early, say) would be
            // left unread, and what it holds dropped without a word.
            parsed.and_then(|v| de.end().map(|()| v).map_err(|e| fail(e.to_string())))
        }
        Format::Yaml => {
            let de = serde_norway::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de)
                .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())))
        }
        Format::Toml => {
            let de = toml::Deserializer::new(text);
            serde_path_to_error::deserialize(de)
                .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())))
        }
    };
    // Read as written, a JSON or TOML document may still hold a settings
    // object written as a list, which serde takes field by field in
    // declaration order: read again from its tree with structs from
    // objects only, and refused if a list stands for one. Only that refusal
    // counts: the tree reads some things otherwise (a map's number keys,
    // say), which the first reading has settled (a refusal of a list is
    // the error even when the first reading failed: it took the list's
    // items for fields). YAML's reader refuses a list for a struct itself,
    // and its tree would turn unquoted scalars into numbers; a document
    // without a JSON tree keeps the first reading.
    let tree: Option<serde_json::Value> = match format {
        Format::Json => serde_json::from_str(text).ok(),
        Format::Toml => toml::from_str(text).ok(),
        Format::Yaml => None,
    };
    if let Some(Err(e)) = tree.map(|tree| from_value::<T>(&tree)) {
        if named_fields::refuses_a_list(e.inner()) {
            return Err(fail(located(e.path().to_string(), e.inner().to_string())));
        }
    }
    let parsed = parsed?;
    match format {
        Format::Json => refuse_repeated_keys(source_name, text)?,
        Format::Yaml => {
            // YAML's messages name the path themselves. Only a repeated
            // key counts: the check stops at a key that is no scalar (a
            // list or a mapping), which the typed reading has settled.
            let de = serde_norway::Deserializer::from_str(text);
            if let Err(e) = unique_keys::UniqueKeys::deserialize(de) {
                let message = e.to_string();
                if unique_keys::refuses_a_repeated_key(&message) {
                    return Err(fail(message));
                }
            }
        }
        // TOML's reader refuses a repeated key itself.
        Format::Toml => {}
    }
    Ok(parsed)
}

/// Refuses a JSON document with an object whose key is written twice, at
/// that object's path: a JSON reader keeps the last value, so a map of
/// names (resources, services) would take the second entry without a
/// word. [`parse`] checks JSON documents with it (and YAML ones the same
/// way; TOML's reader refuses a repeated key itself); call it on a JSON
/// document that is read into a tree first (a tree keeps one value per
/// key).
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
    serde_path_to_error::deserialize::<_, unique_keys::UniqueKeys>(de)
        .map(|_| ())
        .map_err(|e| ConfigError::Parse {
            source_name: source_name.to_owned(),
            message: located(e.path().to_string(), e.inner().to_string()),
        })
}

/// An error's message with the path it is at, if any.
fn located(path: String, inner: String) -> String {
    if path.is_empty() || path == "." {
        inner
    } else {
        format!("at {path}: {inner}")
    }
}

/// Parses a JSON document (named `source_name` in errors) into a tree. An
/// error names its path inside the document, e.g. a number out of range.
///
/// ```
/// let e = broker_core::config::tree("kb.json", r#"{"a": [{"b": 1e400}]}"#).unwrap_err();
/// assert!(e.to_string().starts_with("kb.json: at a[0].b: number out of range"), "{e}");
/// ```
pub fn tree(source_name: &str, text: &str) -> Result<serde_json::Value, ConfigError> {
    let fail = |message: String| ConfigError::Parse {
        source_name: source_name.to_owned(),
        message,
    };
    let de = &mut serde_json::Deserializer::from_str(text);
    let tree = serde_path_to_error::deserialize(&mut *de)
        .map_err(|e| fail(located(e.path().to_string(), e.inner().to_string())))?;
    de.end().map_err(|e| fail(e.to_string()))?;
    Ok(tree)
}

/// Reads `T` from a document already parsed into a JSON tree, every
/// struct from an object only (a list where a struct stands is an error at
/// its path, where serde's derived structs would read the list's items as
/// the fields in order). The error carries the path inside the tree.
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

/// Reads and parses a config file; the format comes from its extension.
pub fn load<T: DeserializeOwned>(path: &std::path::Path) -> Result<T, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Parse {
        source_name: name.clone(),
        message: e.to_string(),
    })?;
    parse(&name, &text, Format::from_path(&name))
}
