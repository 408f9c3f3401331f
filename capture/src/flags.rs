//! The `remora capture` command line: istio-iptables' flags, short and long, plus the
//! environment variables istio-iptables reads in place of (or in addition to) them.
//!
//! Every valued flag is an `Option` so that resolution ([`crate::model`]) can tell "not given"
//! from "given as ''": like istio-iptables, an unset flag falls back to its environment
//! variable and then to its default, while an explicit empty value means "empty list".
//! The environment is never read here; it arrives as an [`Environment`] snapshot, which keeps
//! resolution a pure function that tests drive without touching the process environment.

use std::collections::BTreeMap;

use clap::Args;

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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: CaptureArgs,
    }

    fn parse(argv: &[&str]) -> CaptureArgs {
        let argv = std::iter::once("capture").chain(argv.iter().copied());
        Cli::try_parse_from(argv).expect("flags parse").args
    }

    #[test]
    fn short_and_long_forms_set_the_same_field() {
        let short = parse(&[
            "-p",
            "1",
            "-z",
            "2",
            "-b",
            "*",
            "-i",
            "10.0.0.0/8",
            "-c",
            "eth9",
        ]);
        let long = parse(&[
            "--envoy-port=1",
            "--inbound-capture-port",
            "2",
            "--istio-inbound-ports=*",
            "--istio-service-cidr",
            "10.0.0.0/8",
            "--istio-exclude-interfaces=eth9",
        ]);
        for args in [short, long] {
            assert_eq!(args.envoy_port.as_deref(), Some("1"));
            assert_eq!(args.inbound_capture_port.as_deref(), Some("2"));
            assert_eq!(args.inbound_ports.as_deref(), Some("*"));
            assert_eq!(args.outbound_cidrs.as_deref(), Some("10.0.0.0/8"));
            assert_eq!(args.exclude_interfaces.as_deref(), Some("eth9"));
        }
    }

    #[test]
    fn empty_values_are_kept_apart_from_absent_ones() {
        let args = parse(&["-b", "", "-x", "", "-u", ""]);
        assert_eq!(args.inbound_ports.as_deref(), Some(""));
        assert_eq!(args.outbound_exclude_cidrs.as_deref(), Some(""));
        assert_eq!(args.proxy_uid.as_deref(), Some(""));
        assert_eq!(args.outbound_cidrs, None);
        assert_eq!(parse(&["--dns-servers="]).dns_servers.as_deref(), Some(""));
    }

    #[test]
    fn comma_lists_and_wildcards_pass_through_verbatim() {
        let args = parse(&["-u", "3,4", "-g", "1,2", "-d", "6000,7000,", "-i", "*"]);
        assert_eq!(args.proxy_uid.as_deref(), Some("3,4"));
        assert_eq!(args.proxy_gid.as_deref(), Some("1,2"));
        assert_eq!(args.inbound_exclude_ports.as_deref(), Some("6000,7000,"));
        assert_eq!(args.outbound_cidrs.as_deref(), Some("*"));
    }

    #[test]
    fn repeated_flags_keep_the_last_value() {
        let args = parse(&[
            "-p",
            "1",
            "-p",
            "2",
            "--redirect-dns",
            "--redirect-dns=false",
        ]);
        assert_eq!(args.envoy_port.as_deref(), Some("2"));
        assert_eq!(args.redirect_dns, Some(false));
    }

    #[test]
    fn booleans_take_an_optional_go_style_value() {
        let args = parse(&[
            "--redirect-dns",
            "--capture-all-dns=0",
            "-n",
            "--drop-invalid=T",
        ]);
        assert_eq!(args.redirect_dns, Some(true));
        assert_eq!(args.capture_all_dns, Some(false));
        assert_eq!(args.dry_run, Some(true));
        assert_eq!(args.drop_invalid, Some(true));
        assert_eq!(args.dual_stack, None);
        let argv = ["capture", "--redirect-dns=yes"];
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn unknown_flags_are_rejected() {
        assert!(Cli::try_parse_from(["capture", "--no-such-flag"]).is_err());
    }

    #[test]
    fn boolean_flags_fall_back_to_their_variables() {
        let env = Environment::from_pairs([
            ("REDIRECT_DNS", "false"),
            ("ISTIO_META_DNS_CAPTURE", "true"),
        ]);
        let vars = [var::REDIRECT_DNS, var::META_DNS_CAPTURE];
        assert!(flag_or_env(None, &env, &vars));
        assert!(!flag_or_env(Some(false), &env, &vars));
        let junk =
            Environment::from_pairs([("REDIRECT_DNS", "true"), ("ISTIO_META_DNS_CAPTURE", "on")]);
        assert!(
            flag_or_env(None, &junk, &vars),
            "an invalid value is ignored"
        );
        assert!(!flag_or_env(None, &Environment::default(), &vars));
    }

    #[test]
    fn action_prefers_dry_run() {
        let env = Environment::default();
        assert_eq!(parse(&[]).action(&env), Action::Apply);
        assert_eq!(parse(&["--cleanup-only"]).action(&env), Action::CleanupOnly);
        let dry_cleanup = Action::DryRun { cleanup_only: true };
        assert_eq!(parse(&["--cleanup-only", "-n"]).action(&env), dry_cleanup);
        let env = Environment::from_pairs([("DRY_RUN", "1")]);
        assert_eq!(
            parse(&[]).action(&env),
            Action::DryRun {
                cleanup_only: false
            }
        );
    }

    #[test]
    fn log_level_reads_the_default_scope() {
        let level = |spec: &str| {
            let args = parse(&["--log_output_level", spec]);
            args.log_level().map(str::to_owned)
        };
        assert_eq!(level("default:info").as_deref(), Some("info"));
        assert_eq!(level("debug").as_deref(), Some("debug"));
        assert_eq!(level("ads:debug,default:warn").as_deref(), Some("warn"));
        assert_eq!(level("ads:debug").as_deref(), None);
        assert_eq!(level("default:fatal").as_deref(), Some("error"));
        assert_eq!(level("none").as_deref(), Some("off"));
        assert_eq!(parse(&[]).log_level(), None);
        assert!(parse(&["--log_as_json"]).log_as_json());
        assert!(!parse(&[]).log_as_json());
    }
}
