//! Start-up in istiod mode: the agent settings, the token and root checked before anything
//! runs, the CA rotation loop wired to the identity store and readiness, and the ADS client
//! wired to the xDS store, the metrics and readiness.

use crate::admin::{self, AdminState};
use crate::identity;
use crate::istiod;
use crate::metrics::Metrics;
use anyhow::Context;
use remora_config::Config;
use std::sync::Arc;

/// Istio's agent settings from the environment over the file; `None` off istiod.
pub(super) fn resolve_agent_settings(
    config: &Config,
) -> anyhow::Result<Option<istiod::AgentSettings>> {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let settings = istiod::AgentSettings::resolve(&config.istiod, &env)
        .context("reading Istio's agent settings")?;
    if let Some(s) = &settings {
        tracing::info!(
            discovery_address = %s.discovery_address,
            ca_address = %s.ca_address,
            node_id = %s.node.id,
            cluster_id = %s.cluster_id,
            "istiod mode"
        );
    }
    Ok(settings)
}

/// The token and CA roots read once before anything runs, so their absence fails the start
/// naming the file; returns the roots' PEM.
pub(super) fn check_ca_inputs(settings: &istiod::AgentSettings) -> anyhow::Result<Vec<u8>> {
    let credentials = istiod::CallCredentials::new(&settings.token_file, &settings.cluster_id)?;
    credentials
        .bearer()
        .context("istiod mode needs the service-account token")?;
    std::fs::read(&settings.ca_root_cert_file)
        .with_context(|| {
            format!(
                "istiod's root certificate {}",
                settings.ca_root_cert_file.display()
            )
        })
        .context("istiod mode needs the mesh root certificate")
}

/// istiod mode once the runtime runs: the settings and channels, the ADS client, and the
/// CA's rotation loop unless the certificate comes from files.
pub(super) struct IstiodMode {
    pub settings: istiod::AgentSettings,
    pub channels: istiod::IstiodChannels,
    pub rotation: Option<istiod::rotation::Rotation<istiod::ca::CaClient>>,
    pub xds: istiod::xds::XdsClient,
    /// Told when the first clusters and listeners are in.
    pub readiness: Arc<admin::Readiness>,
}

impl IstiodMode {
    /// Run the rotation loop and the ADS client on the runtime.
    pub fn spawn(self) {
        if let Some(r) = self.rotation {
            tokio::spawn(r.run());
        }
        tracing::info!(xds = %self.channels.xds.address, node = %self.settings.node.id, mode = ?self.settings.xds_mode, "configuration from istiod over ADS");
        tokio::spawn(self.xds.run(self.readiness));
    }
}

/// Open the channels (lazily: nothing is dialled yet) and, with `ca_roots` (no
/// `tls.cert_dir`), the CA client and its rotation loop, readiness told when the first
/// certificate is held; the ADS client delivering into `xds`, its statistics exported and
/// readiness waiting for its first clusters and listeners; with `name_table`, istiod's name
/// table asked for too (the DNS proxy runs). Call inside the runtime: the channels' tasks
/// need it, and before the server is ready.
pub(super) fn istiod_mode(
    settings: istiod::AgentSettings,
    ca_roots: Option<Vec<u8>>,
    store: Arc<identity::Store>,
    metrics: &Metrics,
    state: Arc<AdminState>,
    xds: Arc<remora_xds::store::Store>,
    name_table: bool,
) -> anyhow::Result<IstiodMode> {
    let channels = istiod::IstiodChannels::new(&settings)?;
    let ads = istiod::xds::XdsClient::new(&settings, &channels.xds, Arc::clone(&xds), name_table);
    metrics.set_control_plane(crate::metrics::ControlPlane {
        stats: ads.stats(),
        store: xds,
        refusals: ads.refusals(),
        connection: Arc::clone(&channels.xds.connection),
    });
    // Not ready before istiod's first clusters and listeners: until then Remora knows no
    // service, as Envoy has no listener.
    state.readiness.require(istiod::xds::FIRST_CONFIG);
    let readiness = Arc::clone(&state.readiness);
    let rotation = match ca_roots {
        None => None,
        Some(roots) => {
            let spiffe_id =
                identity::SpiffeId::parse(&settings.spiffe_id()).with_context(|| {
                    format!(
                        "{} is not a SPIFFE ID (trust domain, namespace, service account)",
                        settings.spiffe_id()
                    )
                })?;
            Some(istiod::rotation::Rotation {
                issuer: istiod::ca::CaClient {
                    channel: channels.ca.clone(),
                },
                spiffe_id,
                ttl: settings.secret_ttl,
                grace_period_ratio: settings.grace_period_ratio,
                fallback_roots: roots,
                store,
                metrics: metrics.tls.clone(),
                on_first: Some(Box::new(move || {
                    state.readiness.satisfy(admin::readiness::CERTIFICATE);
                })),
            })
        }
    };
    Ok(IstiodMode {
        settings,
        channels,
        rotation,
        xds: ads,
        readiness,
    })
}
