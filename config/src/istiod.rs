//! The `istiod:` section: how Remora reaches istiod's CA and its xDS as pilot-agent does.
//! Every field has an Istio environment variable too; the proxy resolves the two
//! (`remora::istiod::settings`), the environment winning, as docs/config.md says.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Where pilot-agent reads the projected service-account token istiod authenticates.
pub const ISTIO_TOKEN_FILE: &str = "/var/run/secrets/tokens/istio-token";
/// Where the injector mounts the `istio-ca-root-cert` ConfigMap.
pub const ISTIO_ROOT_CERT_FILE: &str = "/var/run/secrets/istio/root-cert.pem";

/// The control plane. Unset `discovery_address` (and no `PROXY_CONFIG` in the environment):
/// Remora talks to no istiod at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IstiodConfig {
    /// istiod's gRPC address, `host:port` (ProxyConfig's `discoveryAddress`). Setting it turns
    /// istiod mode on.
    pub discovery_address: Option<String>,
    /// The CA's address when it is not istiod's (`CA_ADDR`); defaults to `discovery_address`.
    pub ca_address: Option<String>,
    /// The service-account token sent as `authorization: Bearer`, re-read for every call.
    pub token_file: PathBuf,
    /// The roots istiod's serving certificate is verified against (`XDS_ROOT_CA`, `CA_ROOT_CA`).
    pub root_cert_file: PathBuf,
    /// Istio's `clusterid` header and `CLUSTER_ID` node metadata (`ISTIO_META_CLUSTER_ID`).
    pub cluster_id: String,
    /// The mesh's trust domain, the first part of the SPIFFE ID asked for (`TRUST_DOMAIN`).
    pub trust_domain: String,
    /// The mesh ID in the node metadata (`ISTIO_META_MESH_ID`); defaults to the trust domain.
    pub mesh_id: Option<String>,
    /// The workload certificate's requested lifetime (`SECRET_TTL`).
    #[serde(with = "humantime_serde")]
    pub secret_ttl: Duration,
    /// Share of the lifetime after which the certificate is renewed
    /// (`SECRET_GRACE_PERIOD_RATIO`), between 0 and 1.
    pub secret_grace_period_ratio: Ratio,
    /// The pod's facts, which the injector gives as environment variables (`POD_NAME`,
    /// `POD_NAMESPACE`, `INSTANCE_IP`, `SERVICE_ACCOUNT`); here for runs outside Kubernetes.
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub instance_ip: Option<String>,
    pub service_account: Option<String>,
    /// Extra node metadata, as `ISTIO_META_<NAME>` variables give it.
    pub metadata: BTreeMap<String, String>,
    /// Incremental (delta) ADS, Istio's agent's default since 1.22; `false` speaks state of
    /// the world (`ISTIO_DELTA_XDS`).
    pub delta_xds: bool,
}

impl Default for IstiodConfig {
    fn default() -> Self {
        IstiodConfig {
            discovery_address: None,
            ca_address: None,
            token_file: PathBuf::from(ISTIO_TOKEN_FILE),
            root_cert_file: PathBuf::from(ISTIO_ROOT_CERT_FILE),
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            mesh_id: None,
            secret_ttl: Duration::from_secs(24 * 3600),
            secret_grace_period_ratio: Ratio(0.5),
            pod_name: None,
            pod_namespace: None,
            instance_ip: None,
            service_account: None,
            metadata: BTreeMap::new(),
            delta_xds: true,
        }
    }
}

/// A number between 0 and 1; compared by its bits so the config stays `Eq`.
#[derive(Debug, Clone, Copy)]
pub struct Ratio(pub f64);

impl PartialEq for Ratio {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Ratio {}

impl Serialize for Ratio {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        f64::deserialize(d).map(Ratio)
    }
}

impl IstiodConfig {
    /// Field checks; returns the field under `istiod.` and why.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        for (name, address) in [
            ("discovery_address", &self.discovery_address),
            ("ca_address", &self.ca_address),
        ] {
            if let Some(a) = address {
                check_address(a).map_err(|why| (format!("istiod.{name}"), why))?;
            }
        }
        if self.secret_ttl.is_zero() {
            return Err((
                "istiod.secret_ttl".into(),
                "must be greater than zero".into(),
            ));
        }
        let r = self.secret_grace_period_ratio.0;
        if !(r > 0.0 && r < 1.0) {
            return Err((
                "istiod.secret_grace_period_ratio".into(),
                format!("{r} is not between 0 and 1 (exclusive)"),
            ));
        }
        if self.trust_domain.is_empty() || self.trust_domain.contains('/') {
            return Err((
                "istiod.trust_domain".into(),
                format!("`{}` is not a trust domain", self.trust_domain),
            ));
        }
        Ok(())
    }
}

/// `host:port`, as Istio writes `discoveryAddress`.
pub fn check_address(address: &str) -> Result<(), String> {
    let port = address
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty())
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .filter(|p| *p != 0);
    match port {
        Some(_) => Ok(()),
        None => Err(format!("`{address}` is not host:port")),
    }
}
