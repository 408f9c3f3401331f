//! Why a resource was not applied: the resource, the field path inside it, the type URL when an
//! `Any` is to blame, and the reason, in the words the NACK's `error_detail` and `remora xds
//! validate` print.

use std::fmt;

/// The kinds of resource Remora reads, by the names `remora xds validate` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Listener,
    Cluster,
    Route,
    Endpoint,
    Secret,
    ExtensionConfig,
    NameTable,
}

impl Kind {
    /// Its Envoy message's full name.
    pub fn message_name(self) -> &'static str {
        match self {
            Kind::Listener => "envoy.config.listener.v3.Listener",
            Kind::Cluster => "envoy.config.cluster.v3.Cluster",
            Kind::Route => "envoy.config.route.v3.RouteConfiguration",
            Kind::Endpoint => "envoy.config.endpoint.v3.ClusterLoadAssignment",
            Kind::Secret => "envoy.extensions.transport_sockets.tls.v3.Secret",
            Kind::ExtensionConfig => "envoy.config.core.v3.TypedExtensionConfig",
            Kind::NameTable => "istio.networking.nds.v1.NameTable",
        }
    }

    /// The field that names a resource of this kind.
    pub fn name_field(self) -> &'static str {
        match self {
            Kind::Endpoint => "cluster_name",
            // A name table has no name field: istiod sends one, unnamed.
            _ => "name",
        }
    }

    /// The word printed for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Listener => "listener",
            Kind::Cluster => "cluster",
            Kind::Route => "route",
            Kind::Endpoint => "endpoint",
            Kind::Secret => "secret",
            Kind::ExtensionConfig => "extension_config",
            Kind::NameTable => "name_table",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    pub kind: Kind,
    /// The resource's name (empty when it could not be read).
    pub name: String,
    /// Where in the resource, as proto field names (`filter_chains[3].filters[1].typed_config`);
    /// empty for the resource as a whole.
    pub path: String,
    /// The `Any` type at fault, when one is.
    pub type_url: Option<String>,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: ", self.kind, self.name)?;
        if !self.path.is_empty() {
            f.write_str(&self.path)?;
            if let Some(t) = &self.type_url {
                write!(f, " ({t})")?;
            }
            f.write_str(": ")?;
        } else if let Some(t) = &self.type_url {
            write!(f, "({t}): ")?;
        }
        f.write_str(&self.reason)
    }
}

/// A refusal before it knows which resource it is in; the converters return these and the
/// entry points name the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub path: String,
    pub type_url: Option<String>,
    pub reason: String,
}

impl Fault {
    /// A fault at `path`.
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Fault {
        Fault {
            path: path.into(),
            type_url: None,
            reason: reason.into(),
        }
    }

    /// The same fault, naming the `Any` type it is about (the innermost one wins).
    pub fn with_type(mut self, type_url: &str) -> Fault {
        if self.type_url.is_none() {
            self.type_url = Some(type_url.to_string());
        }
        self
    }

    /// Name the resource.
    pub fn into_refusal(self, kind: Kind, name: &str) -> Refusal {
        Refusal {
            kind,
            name: name.to_string(),
            path: self.path,
            type_url: self.type_url,
            reason: self.reason,
        }
    }
}

/// `base.field`, or `field` at the root.
pub fn join(base: &str, field: &str) -> String {
    if base.is_empty() {
        field.to_string()
    } else {
        format!("{base}.{field}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_resource_path_type_and_reason() {
        let r = Fault::new("filter_chains[3].filters[1].typed_config", "not supported")
            .with_type("type.googleapis.com/x.Y")
            .with_type("type.googleapis.com/outer.Z")
            .into_refusal(Kind::Listener, "virtualInbound");
        assert_eq!(
            r.to_string(),
            "listener virtualInbound: filter_chains[3].filters[1].typed_config \
             (type.googleapis.com/x.Y): not supported"
        );
        let whole = Fault::new("", "HBONE not supported").into_refusal(Kind::Listener, "x");
        assert_eq!(whole.to_string(), "listener x: HBONE not supported");
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a.b");
    }
}
