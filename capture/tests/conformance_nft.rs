//! The native nftables conformance cases (shared/conformance/capture-nft): for each case,
//! `remora capture --native-nftables --dry-run` must print the case's `.nft` byte for byte.
//!
//! The `.args` format is the iptables cases' (see `conformance.rs`); the harness adds
//! `--native-nftables --dry-run` and goes through the same resolution and dry-run printing
//! as the command.

mod support;

use std::path::Path;

use remora_capture::options::RunOptions;
use remora_capture::{dry_run_output, CaptureConfig};
use support::{cases_dir, parse_args, read_case_args, NoDiscovery};

/// What the command would print for a case, and the expected program.
fn run_case(dir: &Path, case: &str) -> Result<(String, String), String> {
    let path = dir.join(format!("{case}.nft"));
    let expected =
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut input = read_case_args(dir, case)?;
    input
        .argv
        .extend(["--native-nftables", "--dry-run"].map(String::from));
    let args = parse_args(&input.argv)?;
    let options = RunOptions::resolve(&args, &input.env).map_err(|e| e.to_string())?;
    let config =
        CaptureConfig::resolve(&args, &input.env, &NoDiscovery).map_err(|e| e.to_string())?;
    let output = dry_run_output(&config, &options).ok_or("not a dry run")?;
    Ok((output, expected))
}

fn assert_case(case: &str) {
    support::assert_golden("capture-nft", "nft", case, run_case);
}

macro_rules! cases {
    ($($name:ident => $case:literal,)*) => {
        /// Every case with a test below.
        const CASES: &[&str] = &[$($case,)*];
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
    basic_exclude_nic => "basic-exclude-nic",
    dns_uid_gid => "dns-uid-gid",
    drop_invalid => "drop-invalid",
    empty => "empty",
    host_ipv4_loopback_cidr => "host-ipv4-loopback-cidr",
    inbound_ports_empty_tproxy => "inbound-ports-empty-tproxy",
    inbound_ports_include => "inbound-ports-include",
    inbound_ports_tproxy => "inbound-ports-tproxy",
    inbound_ports_wildcard_tproxy => "inbound-ports-wildcard-tproxy",
    inbound_ports_wildcard => "inbound-ports-wildcard",
    ip_range => "ip-range",
    ipnets_with_kube_virt_interfaces => "ipnets-with-kube-virt-interfaces",
    ipnets => "ipnets",
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
    outbound_owner_groups_exclude => "outbound-owner-groups-exclude",
    outbound_owner_groups => "outbound-owner-groups",
    outbound_ports_include => "outbound-ports-include",
    tproxy => "tproxy",
}

/// Every case in the folder has a test above, and no test names a missing case.
#[test]
fn every_case_is_listed() {
    let Some(dir) = cases_dir("capture-nft") else {
        return;
    };
    let on_disk = support::case_names(&dir, "args");
    let mut listed: Vec<String> = CASES.iter().map(|c| c.to_string()).collect();
    listed.sort();
    assert_eq!(
        listed,
        on_disk,
        "case list out of date with {}",
        dir.display()
    );
    assert_eq!(
        support::case_names(&dir, "nft"),
        on_disk,
        "each case has a .nft"
    );
    assert_eq!(CASES.len(), 28);
}
