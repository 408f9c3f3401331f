//! The istio-iptables conformance cases (shared/conformance/capture): for each case, the
//! generator's dry-run output must equal the case's `.rules` byte for byte.
//!
//! Each case's `.args` gives the flags on line 1 (shell-quoted) and, on further lines, the
//! inputs istio-iptables takes from the pod: `env NAME=value`, `ipv6 true` and
//! `dns-servers LIST`. They are fed to the generator explicitly: the environment through an
//! [`Environment`] (never the process's), the pod facts through `--assume-ipv6`,
//! `--dns-servers` and a pod that says "IPv4" and refuses to read resolv.conf (the cases give
//! nameservers whenever istio-iptables would read them).

mod support;

use std::path::Path;

use remora_capture::generate;
use support::cases_dir;

/// The cases that must pass for capture to ship.
const REQUIRED: &[&str] = &[
    "default-sidecar",
    "empty",
    "inbound-ports-include",
    "inbound-ports-wildcard",
    "ipnets",
    "outbound-ports-include",
    "outbound-owner-groups",
    "outbound-owner-groups-exclude",
    "host-ipv4-loopback-cidr",
    "cni-basic",
    "cni-custom-uid",
    "cni-include-exclude-ip",
    "cni-include-exclude-ports",
];

/// The other cases that pass (TPROXY, IPv6, DNS, -k, -c, --drop-invalid).
const ALSO_PASSING: &[&str] = &[
    "basic-exclude-nic",
    "cni-custom-uid-tproxy",
    "cni-dns",
    "cni-invalid-drop",
    "cni-tproxy",
    "dns-uid-gid",
    "drop-invalid",
    "inbound-ports-tproxy",
    "inbound-ports-wildcard-tproxy",
    "ip-range",
    "ipnets-with-kube-virt-interfaces",
    "ipv6-dns-outbound-owner-groups-exclude",
    "ipv6-dns-outbound-owner-groups",
    "ipv6-dns-uid-gid",
    "ipv6-empty-inbound-ports",
    "ipv6-inbound-ports",
    "ipv6-ipnets",
    "ipv6-outbound-ports",
    "ipv6-uid-gid",
    "ipv6-virt-interfaces",
    "kube-virt-interfaces",
    "loopback-outbound-iprange",
    "tproxy",
];

/// Cases not implemented yet. Each must still fail: once one passes, move it to
/// [`ALSO_PASSING`] (the `pending_cases_still_fail` test insists).
const PENDING: &[&str] = &[];

/// Runs the generator on a case's inputs and returns (dry-run output, expected rules).
fn run_case(dir: &Path, case: &str) -> Result<(String, String), String> {
    let path = dir.join(format!("{case}.rules"));
    let expected =
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = support::case_config(&support::read_case_args(dir, case)?)?;
    Ok((generate(&config).dry_run_output(), expected))
}

fn assert_case(case: &str) {
    support::assert_golden("capture", "rules", case, run_case);
}

macro_rules! cases {
    ($($name:ident => $case:literal,)*) => {
        $(
            #[test]
            fn $name() {
                assert_case($case);
            }
        )*
    };
}

// One test per case, so a failure names it.
cases! {
    required_default_sidecar => "default-sidecar",
    required_empty => "empty",
    required_inbound_ports_include => "inbound-ports-include",
    required_inbound_ports_wildcard => "inbound-ports-wildcard",
    required_ipnets => "ipnets",
    required_outbound_ports_include => "outbound-ports-include",
    required_outbound_owner_groups => "outbound-owner-groups",
    required_outbound_owner_groups_exclude => "outbound-owner-groups-exclude",
    required_host_ipv4_loopback_cidr => "host-ipv4-loopback-cidr",
    required_cni_basic => "cni-basic",
    required_cni_custom_uid => "cni-custom-uid",
    required_cni_include_exclude_ip => "cni-include-exclude-ip",
    required_cni_include_exclude_ports => "cni-include-exclude-ports",
}

cases! {
    basic_exclude_nic => "basic-exclude-nic",
    cni_custom_uid_tproxy => "cni-custom-uid-tproxy",
    cni_dns => "cni-dns",
    cni_invalid_drop => "cni-invalid-drop",
    cni_tproxy => "cni-tproxy",
    dns_uid_gid => "dns-uid-gid",
    drop_invalid => "drop-invalid",
    inbound_ports_tproxy => "inbound-ports-tproxy",
    inbound_ports_wildcard_tproxy => "inbound-ports-wildcard-tproxy",
    ip_range => "ip-range",
    ipnets_with_kube_virt_interfaces => "ipnets-with-kube-virt-interfaces",
    ipv6_dns_outbound_owner_groups_exclude => "ipv6-dns-outbound-owner-groups-exclude",
    ipv6_dns_outbound_owner_groups => "ipv6-dns-outbound-owner-groups",
    ipv6_dns_uid_gid => "ipv6-dns-uid-gid",
    ipv6_empty_inbound_ports => "ipv6-empty-inbound-ports",
    ipv6_inbound_ports => "ipv6-inbound-ports",
    ipv6_ipnets => "ipv6-ipnets",
    ipv6_outbound_ports => "ipv6-outbound-ports",
    ipv6_uid_gid => "ipv6-uid-gid",
    ipv6_virt_interfaces => "ipv6-virt-interfaces",
    kube_virt_interfaces => "kube-virt-interfaces",
    loopback_outbound_iprange => "loopback-outbound-iprange",
    tproxy => "tproxy",
}

/// Every case in the folder is accounted for exactly once, and every listed case has a
/// test above (the lists and the macros must agree).
#[test]
fn every_case_is_listed() {
    let Some(dir) = cases_dir("capture") else {
        return;
    };
    let on_disk = support::case_names(&dir, "args");
    let mut listed: Vec<String> = [REQUIRED, ALSO_PASSING, PENDING]
        .concat()
        .into_iter()
        .map(str::to_owned)
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        on_disk,
        "case lists out of date with {}",
        dir.display()
    );
    assert_eq!(REQUIRED.len(), 13);
    let tested = include_str!("conformance.rs").matches(" => \"").count();
    assert_eq!(
        tested,
        REQUIRED.len() + ALSO_PASSING.len(),
        "a listed case has no test"
    );
}

#[test]
fn pending_cases_still_fail() {
    let Some(dir) = cases_dir("capture") else {
        return;
    };
    for case in PENDING {
        if let Ok((actual, expected)) = run_case(&dir, case) {
            assert_ne!(
                actual, expected,
                "pending case {case} passes now: move it to ALSO_PASSING"
            );
        }
    }
}
