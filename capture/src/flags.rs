//! The `remora capture` command line: istio-iptables' flags, short and long, plus the
//! environment variables istio-iptables reads in place of (or in addition to) them.
//!
//! Every valued flag is an `Option` so that resolution ([`crate::model`]) can tell "not given"
//! from "given as ''": like istio-iptables, an unset flag falls back to its environment
//! variable and then to its default, while an explicit empty value means "empty list".
//! The environment is never read here; it arrives as an [`Environment`] snapshot, which keeps
//! resolution a pure function that tests drive without touching the process environment.

use clap::{Args, Subcommand};

pub use crate::environment::Environment;
pub(crate) use crate::environment::{flag_or_env, parse_bool, var};
use crate::explain::ExplainArgs;

/// Flags of `remora capture`, compatible with `istio-iptables`.
///
/// A flag that is not given falls back to the environment variable in brackets, then to its
/// default. Repeating a flag is allowed; the last value wins.
#[derive(Debug, Clone, Default, Args)]
#[command(args_override_self = true)]
pub struct CaptureArgs {
    /// Port that all outbound TCP is redirected to [default: 15001]
    #[arg(short = 'p', long = "envoy-port", value_name = "PORT")]
    pub envoy_port: Option<String>,

    /// Port that all inbound TCP is redirected to [env: INBOUND_CAPTURE_PORT] [default: 15006]
    #[arg(short = 'z', long = "inbound-capture-port", value_name = "PORT")]
    pub inbound_capture_port: Option<String>,

    /// Inbound tunnel (HBONE) port, never redirected [env: INBOUND_TUNNEL_PORT] [default: 15008]
    #[arg(short = 'e', long = "inbound-tunnel-port", value_name = "PORT")]
    pub inbound_tunnel_port: Option<String>,

    /// Comma-separated UIDs whose traffic is not redirected (the proxy's) [env: PROXY_UID]
    /// [default: 1337]
    #[arg(short = 'u', long = "proxy-uid", value_name = "UIDS")]
    pub proxy_uid: Option<String>,

    /// Comma-separated GIDs whose traffic is not redirected [env: PROXY_GID] [default: the UIDs]
    #[arg(short = 'g', long = "proxy-gid", value_name = "GIDS")]
    pub proxy_gid: Option<String>,

    /// Inbound interception mode: REDIRECT or TPROXY [env: ISTIO_INBOUND_INTERCEPTION_MODE]
    /// [default: REDIRECT]
    #[arg(
        short = 'm',
        long = "istio-inbound-interception-mode",
        value_name = "MODE"
    )]
    pub inbound_interception_mode: Option<String>,

    /// Packet mark used by TPROXY mode [env: ISTIO_INBOUND_TPROXY_MARK] [default: 1337]
    #[arg(short = 't', long = "istio-inbound-tproxy-mark", value_name = "MARK")]
    pub inbound_tproxy_mark: Option<String>,

    /// Routing table used by TPROXY mode [env: ISTIO_INBOUND_TPROXY_ROUTE_TABLE] [default: 133]
    #[arg(
        short = 'r',
        long = "istio-inbound-tproxy-route-table",
        value_name = "TABLE"
    )]
    pub inbound_tproxy_route_table: Option<String>,

    /// Comma-separated inbound ports to capture; '*' for all, '' for none
    /// [env: ISTIO_INBOUND_PORTS]
    #[arg(short = 'b', long = "istio-inbound-ports", value_name = "PORTS")]
    pub inbound_ports: Option<String>,

    /// Comma-separated inbound ports never captured (only with -b '*')
    /// [env: ISTIO_LOCAL_EXCLUDE_PORTS]
    #[arg(short = 'd', long = "istio-local-exclude-ports", value_name = "PORTS")]
    pub inbound_exclude_ports: Option<String>,

    /// Comma-separated outbound CIDRs to capture; '*' for all, '' for none
    /// [env: ISTIO_SERVICE_CIDR]
    #[arg(short = 'i', long = "istio-service-cidr", value_name = "CIDRS")]
    pub outbound_cidrs: Option<String>,

    /// Comma-separated outbound CIDRs never captured [env: ISTIO_SERVICE_EXCLUDE_CIDR]
    #[arg(short = 'x', long = "istio-service-exclude-cidr", value_name = "CIDRS")]
    pub outbound_exclude_cidrs: Option<String>,

    /// Comma-separated outbound ports always captured [env: ISTIO_OUTBOUND_PORTS]
    #[arg(short = 'q', long = "istio-outbound-ports", value_name = "PORTS")]
    pub outbound_ports: Option<String>,

    /// Comma-separated outbound ports never captured [env: ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE]
    #[arg(
        short = 'o',
        long = "istio-local-outbound-ports-exclude",
        value_name = "PORTS"
    )]
    pub outbound_exclude_ports: Option<String>,

    /// Comma-separated virtual interfaces whose inbound traffic is treated as outbound
    /// [env: KUBE_VIRT_INTERFACES]
    #[arg(short = 'k', long = "kube-virt-interfaces", value_name = "IFACES")]
    pub kube_virt_interfaces: Option<String>,

    /// Comma-separated interfaces whose traffic is never captured
    /// [env: ISTIO_EXCLUDE_INTERFACES]
    #[arg(short = 'c', long = "istio-exclude-interfaces", value_name = "IFACES")]
    pub exclude_interfaces: Option<String>,

    /// Redirect DNS (port 53) to the agent on 15053 [env: REDIRECT_DNS, ISTIO_META_DNS_CAPTURE]
    #[arg(long = "redirect-dns", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub redirect_dns: Option<bool>,

    /// With --redirect-dns: capture all port-53 traffic, not just the resolv.conf servers
    /// [env: CAPTURE_ALL_DNS]
    #[arg(long = "capture-all-dns", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub capture_all_dns: Option<bool>,

    /// Drop packets conntrack marks INVALID [env: DROP_INVALID, INVALID_DROP]
    #[arg(long = "drop-invalid", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub drop_invalid: Option<bool>,

    /// Treat the pod as IPv6 if it has any IPv6 address [env: DUAL_STACK, ISTIO_DUAL_STACK]
    #[arg(long = "dual-stack", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub dual_stack: Option<bool>,

    /// Print the iptables-restore input(s) on stdout and change nothing [env: DRY_RUN]
    #[arg(short = 'n', long = "dry-run", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = parse_bool)]
    pub dry_run: Option<bool>,

    /// Only remove the rules and chains a previous run installed [env: CLEANUP_ONLY]
    #[arg(long = "cleanup-only", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub cleanup_only: Option<bool>,

    /// Use native nftables (one `inet` program loaded with `nft -f`) instead of iptables
    /// [env: NATIVE_NFTABLES]
    #[arg(long = "native-nftables", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = parse_bool)]
    pub native_nftables: Option<bool>,

    /// Break-glass choice of iptables binaries: `legacy` or `nft` instead of detecting them
    /// [env: FORCE_IPTABLES_BINARY]
    #[arg(long = "force-iptables-binary", value_name = "legacy|nft")]
    pub force_iptables_binary: Option<String>,

    /// Replace installed capture rules that differ from the wanted ones instead of failing
    /// [env: RECONCILE]
    #[arg(long = "reconcile", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub reconcile: Option<bool>,

    /// Rewrite the rules even when identical ones are already installed [env: FORCE_APPLY]
    #[arg(long = "force-apply", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub force_apply: Option<bool>,

    /// Install nothing (the CNI plugin did); combine with --run-validation [env: SKIP_RULE_APPLY]
    #[arg(long = "skip-rule-apply", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = parse_bool)]
    pub skip_rule_apply: Option<bool>,

    /// Check that the capture works: dial 127.0.0.6:PROBE-PORT as the proxy and expect to be
    /// redirected to a listener on the capture ports; exit 126 if not [env: RUN_VALIDATION]
    #[arg(long = "run-validation", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = parse_bool)]
    pub run_validation: Option<bool>,

    /// Port the validation dials, which the rules must redirect [env: IPTABLES_PROBE_PORT]
    /// [default: 15002]
    #[arg(long = "iptables-probe-port", value_name = "PORT")]
    pub iptables_probe_port: Option<String>,

    /// How long the validation waits for the redirect, as a Go duration (`5s`, `1m30s`)
    /// [env: PROBE_TIMEOUT] [default: 5s]
    #[arg(long = "probe-timeout", value_name = "DURATION")]
    pub probe_timeout: Option<String>,

    /// Network namespace to work in, as a path (e.g. /var/run/netns/NAME or
    /// /proc/PID/ns/net); commands run under `nsenter --net=PATH` [env: NETWORK_NAMESPACE]
    #[arg(long = "network-namespace", value_name = "PATH")]
    pub network_namespace: Option<String>,

    /// Running from a CNI plugin on the host: keep the iptables lock per pod
    /// [env: CNI_MODE]
    #[arg(long = "cni-mode", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub cni_mode: Option<bool>,

    /// Testing: treat the pod as IPv6 (emit ip6tables rules too) instead of looking at its
    /// addresses
    #[arg(long = "assume-ipv6")]
    pub assume_ipv6: bool,

    /// Testing: comma-separated nameservers to use instead of /etc/resolv.conf ('' = none)
    #[arg(long = "dns-servers", value_name = "ADDRS")]
    pub dns_servers: Option<String>,

    /// Istio log levels, e.g. `default:info` or `debug`
    #[arg(long = "log_output_level", value_name = "SCOPE:LEVEL,...")]
    pub log_output_level: Option<String>,

    /// Log JSON lines instead of text
    #[arg(long = "log_as_json", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub log_as_json: Option<bool>,

    /// A subcommand instead of installing rules.
    #[command(subcommand)]
    pub command: Option<CaptureCommand>,
}

/// Subcommands of `remora capture`.
#[derive(Debug, Clone, Subcommand)]
pub enum CaptureCommand {
    /// Trace a connection through the installed (or given) capture rules, or compare them
    /// with what flags would install (`--check`).
    Explain(ExplainArgs),
}

/// What `remora capture` is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Print the restore inputs (none when only cleaning up); touch nothing.
    DryRun {
        /// `--cleanup-only` was given too.
        cleanup_only: bool,
    },
    /// Install the rules (replacing a previous, different installation).
    Apply,
    /// Remove what a previous run installed.
    CleanupOnly,
}

impl CaptureArgs {
    /// The tracing level for Istio's `default` scope from `--log_output_level`, if given.
    ///
    /// Istio's syntax is a comma list of `scope:level` or bare `level` (all scopes); the last
    /// entry that applies to `default` wins. Istio's `fatal` and `none` map to tracing's
    /// `error` and `off`; other names are returned as written.
    pub fn log_level(&self) -> Option<&str> {
        let spec = self.log_output_level.as_deref()?;
        let mut level = None;
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split_once(':') {
                Some((scope, l)) if scope.trim() == "default" => level = Some(l.trim()),
                Some(_) => {}
                None => level = Some(entry),
            }
        }
        level.map(|l| match l {
            "fatal" => "error",
            "none" => "off",
            other => other,
        })
    }

    /// Whether `--log_as_json` asks for JSON logs.
    pub fn log_as_json(&self) -> bool {
        self.log_as_json.unwrap_or(false)
    }

    /// The action the flags (and their environment variables) select. `--dry-run` wins over
    /// `--cleanup-only`, since a dry run promises to change nothing.
    pub fn action(&self, env: &Environment) -> Action {
        let cleanup_only = flag_or_env(self.cleanup_only, env, &[var::CLEANUP_ONLY]);
        if flag_or_env(self.dry_run, env, &[var::DRY_RUN]) {
            Action::DryRun { cleanup_only }
        } else if cleanup_only {
            Action::CleanupOnly
        } else {
            Action::Apply
        }
    }
}

#[cfg(test)]
#[path = "flags_tests.rs"]
mod tests;
