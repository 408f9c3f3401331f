//! `AuthorizationPolicy` files as users write them for `kubectl apply`: YAML (or JSON), one or
//! more documents per file, `security.istio.io/v1` or `v1beta1`.
//!
//! Parsing is a pure function from text to validated, compiled [`Policy`]s; an error names the
//! file, the line and the field. Documents of other kinds (a `PeerAuthentication` kept in the
//! same file) are skipped. Unknown fields under `spec` are refused, so a typo is an error rather
//! than a rule that silently matches more or less than meant.

use super::compile::{self, Context};
use super::engine::Policy;
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// API versions of `AuthorizationPolicy` that Istio serves.
const API_VERSIONS: [&str; 2] = ["security.istio.io/v1", "security.istio.io/v1beta1"];

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{}: cannot read: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", Located { file, line: *line, column: *column, field, message })]
    Invalid {
        file: PathBuf,
        /// 1-based, when it can be told.
        line: Option<usize>,
        column: Option<usize>,
        /// Dotted path of the offending field (`spec.rules[0].to[0].operation.ports[1]`).
        field: String,
        message: String,
    },
}

impl PolicyError {
    /// The line the error points at, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            PolicyError::Read { .. } => None,
            PolicyError::Invalid { line, .. } => *line,
        }
    }
}

struct Located<'a> {
    file: &'a Path,
    line: Option<usize>,
    column: Option<usize>,
    field: &'a str,
    message: &'a str,
}

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        match self.field {
            "" => write!(f, ": {}", self.message),
            field => write!(f, ": field `{field}`: {}", self.message),
        }
    }
}

/// What a document says it is.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    api_version: Option<String>,
    kind: Option<String>,
}

/// An `AuthorizationPolicy` document.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Document {
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: Spec,
}

/// The object's metadata; Kubernetes adds fields Remora has no use for.
#[derive(Debug, Deserialize)]
pub(super) struct Metadata {
    pub name: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Spec {
    pub selector: Option<Selector>,
    pub target_ref: Option<IgnoredAny>,
    pub target_refs: Option<Vec<IgnoredAny>>,
    pub action: RawAction,
    pub provider: Option<Provider>,
    pub rules: Option<Vec<Option<RawRule>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Selector {
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub(super) enum RawAction {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Provider {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawRule {
    pub from: Option<Vec<Option<From>>>,
    pub to: Option<Vec<Option<To>>>,
    pub when: Option<Vec<Option<Condition>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct From {
    pub source: Option<Source>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct To {
    pub operation: Option<Operation>,
}

/// Every list is `None` when absent, so "absent" and "empty" can be told apart as Istio does.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Source {
    pub principals: Option<Vec<String>>,
    pub not_principals: Option<Vec<String>>,
    pub request_principals: Option<Vec<String>>,
    pub not_request_principals: Option<Vec<String>>,
    pub namespaces: Option<Vec<String>>,
    pub not_namespaces: Option<Vec<String>>,
    pub service_accounts: Option<Vec<String>>,
    pub not_service_accounts: Option<Vec<String>>,
    pub trust_domains: Option<Vec<String>>,
    pub not_trust_domains: Option<Vec<String>>,
    pub ip_blocks: Option<Vec<String>>,
    pub not_ip_blocks: Option<Vec<String>>,
    pub remote_ip_blocks: Option<Vec<String>>,
    pub not_remote_ip_blocks: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Operation {
    pub hosts: Option<Vec<String>>,
    pub not_hosts: Option<Vec<String>>,
    pub ports: Option<Vec<String>>,
    pub not_ports: Option<Vec<String>>,
    pub methods: Option<Vec<String>>,
    pub not_methods: Option<Vec<String>>,
    pub paths: Option<Vec<String>>,
    pub not_paths: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Condition {
    pub key: String,
    pub values: Option<Vec<String>>,
    pub not_values: Option<Vec<String>>,
}

/// A parsed file: its policies, and what deserves a warning (for the log).
#[derive(Debug, Default)]
pub struct Parsed {
    pub policies: Vec<Policy>,
    pub warnings: Vec<String>,
}

/// Parse and validate the text of one file. `file` only names it in errors.
pub fn parse(text: &str, file: &Path, ctx: &Context) -> Result<Parsed, PolicyError> {
    let mut parsed = Parsed::default();
    for (first_line, doc) in documents(text) {
        let invalid =
            |line: Option<usize>, column, field: String, message: String| PolicyError::Invalid {
                file: file.to_path_buf(),
                line: line.map(|l| l + first_line - 1),
                column,
                field,
                message,
            };
        let de_error = |e: serde_path_to_error::Error<serde_yaml_ng::Error>| {
            let field = match e.path().to_string() {
                dot if dot == "." => String::new(),
                path => path,
            };
            let inner = e.into_inner();
            let (line, column) = match inner.location() {
                Some(l) => (Some(l.line()), Some(l.column())),
                None => (None, None),
            };
            invalid(line, column, field, without_location(&inner.to_string()))
        };
        let header: Option<Header> =
            serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(doc))
                .map_err(de_error)?;
        let Some(header) = header else { continue };
        if header.kind.as_deref() != Some("AuthorizationPolicy") {
            continue;
        }
        let api = header.api_version.unwrap_or_default();
        if !API_VERSIONS.contains(&api.as_str()) {
            let message = format!("`{api}` is not an AuthorizationPolicy version Istio serves (security.istio.io/v1 or v1beta1)");
            let line = crate::authz::locate::line_of(doc, "apiVersion");
            return Err(invalid(line, None, "apiVersion".into(), message));
        }
        let document: Document =
            serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(doc))
                .map_err(de_error)?;
        let (policy, warnings) = compile::policy(&document, ctx).map_err(|(field, message)| {
            let line = crate::authz::locate::line_of(doc, &field);
            invalid(line, None, field, message)
        })?;
        let name = format!("{}/{}", policy.namespace, policy.name);
        parsed
            .warnings
            .extend(warnings.into_iter().map(|w| format!("{name}: {w}")));
        parsed.policies.push(policy);
    }
    Ok(parsed)
}

/// The documents of a YAML stream, each with the 1-based line it starts on. A document starts
/// at a `---` line, which stays in it so its lines keep their numbers.
fn documents(text: &str) -> Vec<(usize, &str)> {
    let mut docs = Vec::new();
    let (mut start, mut start_line) = (0, 1);
    let mut offset = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if marker && offset > start {
            docs.push((start_line, &text[start..offset]));
            start = offset;
            start_line = i + 1;
        }
        offset += line.len();
    }
    docs.push((start_line, &text[start..]));
    docs.retain(|(_, d)| {
        d.lines().any(|l| {
            let l = l.trim();
            !(l.is_empty() || l.starts_with('#') || l == "---" || l == "...")
        })
    });
    docs
}

/// serde_yaml_ng appends " at line L column C"; the location is printed once, by us.
fn without_location(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_keep_their_line_numbers() {
        let text = "# a\n---\nkind: A\n---\n# only a comment\n---\nkind: B\n";
        let docs = documents(text);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0], (2, "---\nkind: A\n"));
        assert_eq!(docs[1].0, 6);
        assert_eq!(docs[1].1, "---\nkind: B\n");
    }
}
