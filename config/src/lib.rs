//! Remora's configuration: one schema, its built-in defaults and its parser.
//!
//! A config is data. [`Config::default`] equals Istio's sidecar defaults; [`parse`] turns YAML text
//! into a validated [`Config`] or a [`ConfigError`] that names the file, the line and the field.
//! The proxy never mutates a `Config`: a reload builds a new one and swaps it in whole.
//! The schema is documented for users in `docs/config.md`; keep the two in step.
//! [`file_watch`] wakes whoever holds file-backed config (the proxy's config, xDS files,
//! certificates, policies; the webhook's certificate) when its directory changes.

mod authz;
mod dns;
mod error;
pub mod file_watch;
mod istiod;
mod locate;
mod mesh;
mod model;
mod overload;
mod traffic;
mod xds;

pub use error::ConfigError;
pub use model::*;

use std::path::Path;

/// Parse and validate YAML config text. `file` is only used to name the source in errors.
pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
    // An empty document (or one holding only comments) means "all defaults".
    if text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    }) {
        return Ok(Config::default());
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let (line, column) = match inner.location() {
            Some(loc) => (Some(loc.line()), Some(loc.column())),
            None => (locate::line_of(text, &field), None),
        };
        let field = if field == "." { String::new() } else { field };
        let message = strip_location(&inner.to_string());
        // serde_yaml_ng already prefixes nested errors with the path; we print it once.
        let message = match message.split_once(": ") {
            Some((prefix, rest)) if !field.is_empty() && field.starts_with(prefix) => {
                rest.to_string()
            }
            _ => message,
        };
        ConfigError::Invalid {
            file: file.to_path_buf(),
            line,
            column,
            field,
            message,
        }
    })?;
    config
        .validate()
        .map_err(|(field, message)| ConfigError::Invalid {
            file: file.to_path_buf(),
            line: locate::line_of(text, &field),
            column: None,
            field,
            message,
        })?;
    Ok(config)
}

/// Read and parse a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// serde_yaml_ng appends " at line L column C" to its messages; we print the location ourselves.
fn strip_location(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests;
