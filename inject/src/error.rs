//! Why injection failed. Each variant names what the user must fix: the annotation, the
//! document or the field.

/// An injection failure. Injection either succeeds whole or leaves its input untouched.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// An annotation that shapes injection has a value Istio (and so Remora) refuses.
    #[error("invalid value {value:?} for annotation {annotation}: {reason}")]
    InvalidAnnotation {
        annotation: String,
        value: String,
        reason: String,
    },
    /// `inject.istio.io/templates` asks for a template Remora does not implement.
    #[error("injection template {template:?} (annotation inject.istio.io/templates) is not supported: {reason}")]
    UnsupportedTemplate { template: String, reason: String },
    /// The pod template is not shaped like one (a list where a map belongs, a container
    /// without a name).
    #[error("{path}: {reason}")]
    InvalidPod { path: String, reason: String },
    /// A YAML document could not be parsed.
    #[error("document {document} is not valid YAML")]
    Yaml {
        /// 1-based index among the input's documents.
        document: usize,
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// Injected output could not be written as YAML.
    #[error("writing YAML")]
    Emit(#[source] serde_yaml_ng::Error),
}

impl InjectError {
    pub(crate) fn pod(path: impl Into<String>, reason: impl Into<String>) -> InjectError {
        InjectError::InvalidPod {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
