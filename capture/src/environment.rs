//! The environment variables `remora capture` reads, and the [`Environment`] snapshot that
//! carries them into resolution.
//!
//! istio-iptables binds most flags to a variable (the flag's name upper-cased, dashes as
//! underscores) and reads a few inputs only from the environment. The process environment is
//! read once, in [`Environment::from_process`]; everything after that is a pure function of
//! the snapshot, which is how tests drive it without touching the process's variables.

use std::collections::BTreeMap;

/// Resolves a boolean flag the way istio-iptables does: the command line wins; otherwise the
/// variables are read in order and the last one that is set to a valid boolean wins (that is
/// how its "additional" variables override the primary one); otherwise false.
pub(crate) fn flag_or_env(flag: Option<bool>, env: &Environment, vars: &[&str]) -> bool {
    if let Some(value) = flag {
        return value;
    }
    let mut value = false;
    for name in vars {
        if let Some(raw) = env.get(name) {
            match parse_bool(raw) {
                Ok(v) => value = v,
                // istio-iptables silently ignores such values; say so at least.
                Err(_) => {
                    tracing::warn!(variable = name, value = raw, "ignoring non-boolean value")
                }
            }
        }
    }
    value
}

/// Parses a boolean as Go's `strconv.ParseBool` does, which is what istio-iptables accepts.
pub(crate) fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (use true or false)")),
    }
}

/// Names of the environment variables `remora capture` reads.
pub(crate) mod var {
    pub const INBOUND_CAPTURE_PORT: &str = "INBOUND_CAPTURE_PORT";
    pub const INBOUND_TUNNEL_PORT: &str = "INBOUND_TUNNEL_PORT";
    pub const PROXY_UID: &str = "PROXY_UID";
    pub const PROXY_GID: &str = "PROXY_GID";
    pub const INTERCEPTION_MODE: &str = "ISTIO_INBOUND_INTERCEPTION_MODE";
    pub const TPROXY_MARK: &str = "ISTIO_INBOUND_TPROXY_MARK";
    pub const TPROXY_ROUTE_TABLE: &str = "ISTIO_INBOUND_TPROXY_ROUTE_TABLE";
    pub const INBOUND_PORTS: &str = "ISTIO_INBOUND_PORTS";
    pub const LOCAL_EXCLUDE_PORTS: &str = "ISTIO_LOCAL_EXCLUDE_PORTS";
    pub const SERVICE_CIDR: &str = "ISTIO_SERVICE_CIDR";
    pub const SERVICE_EXCLUDE_CIDR: &str = "ISTIO_SERVICE_EXCLUDE_CIDR";
    pub const OUTBOUND_PORTS: &str = "ISTIO_OUTBOUND_PORTS";
    pub const LOCAL_OUTBOUND_PORTS_EXCLUDE: &str = "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE";
    pub const KUBE_VIRT_INTERFACES: &str = "KUBE_VIRT_INTERFACES";
    pub const EXCLUDE_INTERFACES: &str = "ISTIO_EXCLUDE_INTERFACES";
    pub const REDIRECT_DNS: &str = "REDIRECT_DNS";
    pub const META_DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
    pub const CAPTURE_ALL_DNS: &str = "CAPTURE_ALL_DNS";
    pub const DROP_INVALID: &str = "DROP_INVALID";
    pub const INVALID_DROP: &str = "INVALID_DROP";
    pub const DUAL_STACK: &str = "DUAL_STACK";
    pub const ISTIO_DUAL_STACK: &str = "ISTIO_DUAL_STACK";
    pub const DRY_RUN: &str = "DRY_RUN";
    pub const CLEANUP_ONLY: &str = "CLEANUP_ONLY";
    pub const NATIVE_NFTABLES: &str = "NATIVE_NFTABLES";
    pub const FORCE_IPTABLES_BINARY: &str = "FORCE_IPTABLES_BINARY";
    pub const RECONCILE: &str = "RECONCILE";
    pub const FORCE_APPLY: &str = "FORCE_APPLY";
    pub const SKIP_RULE_APPLY: &str = "SKIP_RULE_APPLY";
    pub const RUN_VALIDATION: &str = "RUN_VALIDATION";
    pub const IPTABLES_PROBE_PORT: &str = "IPTABLES_PROBE_PORT";
    pub const PROBE_TIMEOUT: &str = "PROBE_TIMEOUT";
    pub const NETWORK_NAMESPACE: &str = "NETWORK_NAMESPACE";
    pub const CNI_MODE: &str = "CNI_MODE";
    /// Environment-only: groups whose traffic is captured (`*` = all).
    pub const OWNER_GROUPS: &str = "ISTIO_OUTBOUND_OWNER_GROUPS";
    /// Environment-only: groups excluded when OWNER_GROUPS is `*`.
    pub const OWNER_GROUPS_EXCLUDE: &str = "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE";
    /// Environment-only: the IPv4 loopback range the app's own traffic uses.
    pub const IPV4_LOOPBACK_CIDR: &str = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR";

    /// Every variable above, for taking a snapshot of the process environment.
    pub const ALL: &[&str] = &[
        INBOUND_CAPTURE_PORT,
        INBOUND_TUNNEL_PORT,
        PROXY_UID,
        PROXY_GID,
        INTERCEPTION_MODE,
        TPROXY_MARK,
        TPROXY_ROUTE_TABLE,
        INBOUND_PORTS,
        LOCAL_EXCLUDE_PORTS,
        SERVICE_CIDR,
        SERVICE_EXCLUDE_CIDR,
        OUTBOUND_PORTS,
        LOCAL_OUTBOUND_PORTS_EXCLUDE,
        KUBE_VIRT_INTERFACES,
        EXCLUDE_INTERFACES,
        REDIRECT_DNS,
        META_DNS_CAPTURE,
        CAPTURE_ALL_DNS,
        DROP_INVALID,
        INVALID_DROP,
        DUAL_STACK,
        ISTIO_DUAL_STACK,
        DRY_RUN,
        CLEANUP_ONLY,
        NATIVE_NFTABLES,
        FORCE_IPTABLES_BINARY,
        RECONCILE,
        FORCE_APPLY,
        SKIP_RULE_APPLY,
        RUN_VALIDATION,
        IPTABLES_PROBE_PORT,
        PROBE_TIMEOUT,
        NETWORK_NAMESPACE,
        CNI_MODE,
        OWNER_GROUPS,
        OWNER_GROUPS_EXCLUDE,
        IPV4_LOOPBACK_CIDR,
    ];
}

/// A snapshot of the environment variables `remora capture` reads.
///
/// A variable that is set to the empty string counts as set, as in istio-iptables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    vars: BTreeMap<String, String>,
}

impl Environment {
    /// Reads the variables `remora capture` knows from the process environment.
    pub fn from_process() -> Self {
        let mut vars = BTreeMap::new();
        for name in var::ALL {
            match std::env::var(name) {
                Ok(value) => {
                    vars.insert((*name).to_owned(), value);
                }
                Err(std::env::VarError::NotPresent) => {}
                Err(std::env::VarError::NotUnicode(_)) => {
                    tracing::warn!(variable = name, "ignoring non-UTF-8 environment variable");
                }
            }
        }
        Environment { vars }
    }

    /// An environment made of exactly these variables (for tests and embedding).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Environment {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The value of a variable, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
}
