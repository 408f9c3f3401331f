//! Pod network setup that the rules rely on but iptables cannot do, run with `ip`:
//! - an IPv6 pod gets `::6/128` on `lo`, the source address the proxy binds for inbound
//!   passthrough (IPv4 needs nothing: all of 127/8 is already local);
//! - TPROXY mode needs policy routing that delivers marked packets locally: a rule
//!   `fwmark MARK lookup TABLE` and a `local default dev lo` route in that table.
//!
//! Every step is safe to repeat: addresses and routes use `replace`, and the rule (which
//! `ip rule add` would happily duplicate) is only added when `ip rule show` does not list it.

use crate::error::CaptureError;
use crate::model::{CaptureConfig, InboundCapture, InterceptionMode};
use crate::runner::Runner;

/// One `ip` invocation (the arguments after `ip`), skipped when `unless_listed` (also `ip`
/// arguments) prints anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What to run.
    pub command: Vec<String>,
    /// A query whose non-empty output means the step is already done.
    pub unless_listed: Option<Vec<String>>,
}

/// The steps that prepare the pod's network for `cfg`, in order.
pub fn steps(cfg: &CaptureConfig) -> Vec<Step> {
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let mut steps = Vec::new();
    if cfg.ipv6 {
        let command = owned(&["-6", "addr", "replace", "::6/128", "dev", "lo"]);
        steps.push(Step {
            command,
            unless_listed: None,
        });
    }
    if cfg.mode == InterceptionMode::Tproxy && cfg.inbound != InboundCapture::Off {
        let families: &[&str] = if cfg.ipv6 { &["-4", "-6"] } else { &["-4"] };
        let (mark, table) = (cfg.tproxy_mark.as_str(), cfg.tproxy_route_table.as_str());
        for family in families {
            let selector = ["fwmark", mark, "lookup", table];
            steps.push(Step {
                command: owned(&[&[*family, "rule", "add"][..], &selector].concat()),
                unless_listed: Some(owned(&[&[*family, "rule", "show"][..], &selector].concat())),
            });
        }
        for family in families {
            let route = [
                *family, "route", "replace", "local", "default", "dev", "lo", "table", table,
            ];
            steps.push(Step {
                command: owned(&route),
                unless_listed: None,
            });
        }
    }
    steps
}

/// Runs [`steps`].
pub fn configure(cfg: &CaptureConfig, runner: &dyn Runner) -> Result<(), CaptureError> {
    for step in steps(cfg) {
        let line = step.command.join(" ");
        if let Some(query) = &step.unless_listed {
            let query: Vec<&str> = query.iter().map(String::as_str).collect();
            if !runner.run("ip", &query, None)?.trim().is_empty() {
                tracing::info!(command = %line, "already configured");
                continue;
            }
        }
        let args: Vec<&str> = step.command.iter().map(String::as_str).collect();
        runner.run("ip", &args, None)?;
        tracing::info!(command = %line, "configured");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> CaptureConfig {
        use crate::model::*;
        CaptureConfig {
            proxy_port: "15001".into(),
            inbound_capture_port: "15006".into(),
            inbound_tunnel_port: "15008".into(),
            proxy_uids: vec!["1337".into()],
            proxy_gids: vec!["1337".into()],
            mode: InterceptionMode::Redirect,
            tproxy_mark: "1337".into(),
            tproxy_route_table: "133".into(),
            inbound: InboundCapture::AllExcept(vec![]),
            outbound_cidrs: OutboundCidrs::All,
            outbound_exclude_cidrs: CidrsByFamily::default(),
            outbound_ports: vec![],
            outbound_exclude_ports: vec![],
            kube_virt_interfaces: vec![],
            exclude_interfaces: vec![],
            owner_groups: OwnerGroups::AllExcept(vec![]),
            ipv4_loopback_cidr: "127.0.0.1/32".into(),
            dns: DnsCapture::Off,
            drop_invalid: false,
            ipv6: false,
        }
    }

    fn lines(cfg: &CaptureConfig) -> Vec<String> {
        steps(cfg).iter().map(|s| s.command.join(" ")).collect()
    }

    #[test]
    fn redirect_ipv4_needs_nothing() {
        assert!(steps(&base()).is_empty());
    }

    #[test]
    fn ipv6_gets_the_passthrough_address() {
        let cfg = CaptureConfig {
            ipv6: true,
            ..base()
        };
        assert_eq!(lines(&cfg), ["-6 addr replace ::6/128 dev lo"]);
    }

    #[test]
    fn tproxy_routes_marked_packets_locally() {
        let cfg = CaptureConfig {
            mode: InterceptionMode::Tproxy,
            ipv6: true,
            ..base()
        };
        let expected = [
            "-6 addr replace ::6/128 dev lo",
            "-4 rule add fwmark 1337 lookup 133",
            "-6 rule add fwmark 1337 lookup 133",
            "-4 route replace local default dev lo table 133",
            "-6 route replace local default dev lo table 133",
        ];
        assert_eq!(lines(&cfg), expected);
        let query = steps(&cfg)[1].unless_listed.clone().unwrap().join(" ");
        assert_eq!(query, "-4 rule show fwmark 1337 lookup 133");
        let no_inbound = CaptureConfig {
            inbound: InboundCapture::Off,
            ..cfg
        };
        assert_eq!(lines(&no_inbound), ["-6 addr replace ::6/128 dev lo"]);
    }
}
