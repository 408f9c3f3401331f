//! Which injection template a pod asks for (`inject.istio.io/templates`). Istio renders and
//! merges Go templates by name; Remora implements each of Istio's built-in templates as code
//! ([`crate::injector`] for the sidecar, [`crate::gateway`], [`crate::grpc`]) and refuses any
//! other name, and any mix of different templates, rather than inject something else.

use crate::error::InjectError;
use crate::names::key;
use std::collections::BTreeMap;

/// One of Istio's built-in injection templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// The sidecar proxy with capture (the default).
    Sidecar,
    /// A gateway: the pod's own `istio-proxy` becomes the proxy; nothing is captured.
    Gateway,
    /// Proxyless gRPC beside the agent: the application talks xDS itself, the proxy container
    /// only serves the agent port.
    GrpcAgent,
    /// Proxyless gRPC alone: an init container writes the application's xDS bootstrap.
    GrpcSimple,
}

impl Template {
    /// Istio's name.
    pub fn name(self) -> &'static str {
        match self {
            Template::Sidecar => "sidecar",
            Template::Gateway => "gateway",
            Template::GrpcAgent => "grpc-agent",
            Template::GrpcSimple => "grpc-simple",
        }
    }

    fn parse(name: &str) -> Option<Template> {
        [
            Template::Sidecar,
            Template::Gateway,
            Template::GrpcAgent,
            Template::GrpcSimple,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    /// The template of a pod: the annotation's comma-separated names (a name may repeat, as
    /// in `sidecar,sidecar`), or the sidecar without one.
    pub fn of_pod(annotations: &BTreeMap<String, String>) -> Result<Template, InjectError> {
        let Some(raw) = annotations.get(key::TEMPLATES) else {
            return Ok(Template::Sidecar);
        };
        let mut chosen: Option<Template> = None;
        for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let template =
                Template::parse(name).ok_or_else(|| InjectError::UnsupportedTemplate {
                    template: name.into(),
                    reason: "Remora implements sidecar, gateway, grpc-agent and grpc-simple".into(),
                })?;
            match chosen {
                Some(c) if c != template => {
                    // Istio merges such lists template over template; what that merge makes
                    // of two different roles is not a decision Remora can mirror as code.
                    return Err(InjectError::UnsupportedTemplate {
                        template: raw.clone(),
                        reason: "Remora does not combine different templates".into(),
                    });
                }
                _ => chosen = Some(template),
            }
        }
        Ok(chosen.unwrap_or(Template::Sidecar))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(value: &str) -> Result<Template, InjectError> {
        Template::of_pod(&BTreeMap::from([(
            key::TEMPLATES.to_string(),
            value.to_string(),
        )]))
    }

    #[test]
    fn names_repeat_but_do_not_mix() {
        assert_eq!(
            Template::of_pod(&BTreeMap::new()).ok(),
            Some(Template::Sidecar)
        );
        assert_eq!(of("sidecar, sidecar,sidecar").ok(), Some(Template::Sidecar));
        assert_eq!(of("gateway").ok(), Some(Template::Gateway));
        assert_eq!(of("grpc-agent").ok(), Some(Template::GrpcAgent));
        assert_eq!(of("grpc-simple").ok(), Some(Template::GrpcSimple));
        assert!(matches!(
            of("spire"),
            Err(InjectError::UnsupportedTemplate { template, .. }) if template == "spire"
        ));
        assert!(of("gateway,sidecar").is_err());
    }
}
