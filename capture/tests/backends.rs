//! The backends against the kernel, inside network namespaces created for the test (never
//! the machine's own): native nftables (atomic load, idempotent re-run, replacement,
//! cleanup) and the two iptables flavours (detection, forcing, drift, `--reconcile` in one
//! restore per family). Commands reach the namespace the way `--network-namespace` does,
//! through `nsenter --net=PATH`.
//!
//! Needs root, iproute2, iptables (legacy and nft) and nftables; skipped with a message
//! without them, except under CI=true, where it fails instead.

mod support;

use std::cell::RefCell;

use remora_capture::apply::{InstallOptions, Installed};
use remora_capture::iptables_binaries::Flavour;
use remora_capture::nft::{self, NftTable};
use remora_capture::options::RunOptions;
use remora_capture::{
    apply_rules, system_runner, CaptureConfig, CaptureError, CommandError, Environment,
    IptablesToolset, Runner,
};
use support::{parse_args, Netns, NoDiscovery};

/// Resolves flags (shell words) plus `--network-namespace` for `ns`.
fn resolve(ns: &Netns, flags: &str) -> (CaptureConfig, RunOptions) {
    let mut argv = shlex::split(flags).expect("shell words");
    argv.push(format!("--network-namespace={}", ns.path().display()));
    let args = parse_args(&argv).expect("flags parse");
    let env = Environment::default();
    let options = RunOptions::resolve(&args, &env).expect("options resolve");
    let config = CaptureConfig::resolve(&args, &env, &NoDiscovery).expect("config resolves");
    (config, options)
}

/// Passes commands through and records the stdin of every writing restore or nft load.
struct Recording<R> {
    inner: R,
    writes: RefCell<Vec<String>>,
}

impl<R: Runner> Runner for Recording<R> {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, CommandError> {
        if let Some(input) = stdin {
            if !input.contains("\n-C ") {
                self.writes.borrow_mut().push(format!("{program}: {input}"));
            }
        }
        self.inner.run(program, args, stdin)
    }
}

fn nft_tables(runner: &dyn Runner) -> String {
    runner
        .run("nft", &["list", "tables"], None)
        .expect("nft list tables")
}

const NFT_A: &str = "--native-nftables -p 15001 -z 15006 -u 1337 -m TPROXY -b '*' -d 15090 \
                     -i '*' -x 10.10.0.0/16 -c eth9 -k eth8 --redirect-dns \
                     --dns-servers=10.96.0.10,fd00::10 --drop-invalid --assume-ipv6";
const NFT_B: &str = "--native-nftables -b 8080,9090 -i 10.0.0.0/8 --assume-ipv6";

#[test]
fn nftables_loads_atomically_is_idempotent_replaces_and_cleans_up() {
    let Some(ns) = Netns::create_or_skip("cap-nft", &[&["nft", "list", "ruleset"]]) else {
        return;
    };
    let foreign = "add table inet other\nadd chain inet other c { type filter hook output priority 0 ; }\nadd rule inet other c tcp dport 9 counter\n";
    ns.runner().run("nft", &["-f", "-"], Some(foreign)).unwrap();

    let (config_a, options_a) = resolve(&ns, NFT_A);
    let runner = Recording {
        inner: system_runner(&options_a),
        writes: RefCell::default(),
    };
    apply_rules(&config_a, &options_a, &runner).expect("install A");
    let tables = nft_tables(&runner);
    for table in NftTable::ALL {
        assert!(tables.contains(table.name()), "{tables}");
    }
    assert_eq!(runner.writes.borrow().len(), 1, "one nft transaction");
    let ruleset_a = ns
        .runner()
        .run("nft", &["-s", "list", "ruleset"], None)
        .unwrap();
    assert!(ruleset_a.contains("tproxy ip6 to :15006"), "{ruleset_a}");

    // The same flags again: the kernel's listing is recognised as the program.
    let program_a = nft::generate_nft(&config_a);
    let options = InstallOptions {
        reconcile: false,
        force_apply: false,
    };
    let again = nft::apply::install(&program_a, options, &runner).expect("reinstall");
    assert_eq!(again, Installed::Unchanged);
    assert_eq!(runner.writes.borrow().len(), 1, "nothing written");

    // Other flags: one transaction replaces nat and drops the tables no longer used.
    let (config_b, options_b) = resolve(&ns, NFT_B);
    let program_b = nft::generate_nft(&config_b);
    let replaced = nft::apply::install(&program_b, options, &runner).expect("replace");
    assert_eq!(replaced, Installed::Replaced);
    assert_eq!(runner.writes.borrow().len(), 2);
    let tables = nft_tables(&runner);
    assert!(
        tables.contains("istio-proxy-nat") && !tables.contains("istio-proxy-mangle"),
        "{tables}"
    );
    let nat = ns
        .runner()
        .run("nft", &["list", "table", "inet", "istio-proxy-nat"], None)
        .unwrap();
    assert!(
        nat.contains("tcp dport 8080") && !nat.contains("10.10.0.0/16"),
        "{nat}"
    );

    // Cleanup removes ours, leaves the foreign table, and is a no-op the second time.
    let cleanup = RunOptions {
        action: remora_capture::Action::CleanupOnly,
        ..options_b
    };
    apply_rules(&config_b, &cleanup, &runner).expect("cleanup");
    apply_rules(&config_b, &cleanup, &runner).expect("cleanup again");
    let tables = nft_tables(&runner);
    assert_eq!(tables.trim(), "table inet other", "{tables}");
}

// No -c/-k here: their RETURNs sit in built-in chains, where only the current flags' rules
// can be recognised as ours (see apply.rs), so a replacement cannot remove older ones.
const IPT_A: &str = "-b '*' -d 15090,15021 -i '*' -x 10.10.0.0/16 --drop-invalid";
const IPT_B: &str = "-b 8080,9090 -i 10.0.0.0/8";

fn has_istio_chains(runner: &dyn Runner, save: &str) -> bool {
    runner
        .run(save, &[], None)
        .expect("save")
        .contains(":ISTIO_OUTPUT")
}

#[test]
fn iptables_flavours_are_detected_forced_and_reconciled_atomically() {
    let tools: &[&[&str]] = &[&["iptables-legacy-save"], &["iptables-nft-save"]];
    let Some(ns) = Netns::create_or_skip("cap-ipt", tools) else {
        return;
    };
    let runner = Recording {
        inner: ns.runner(),
        writes: RefCell::default(),
    };

    // An empty namespace: nft is preferred.
    let detected = IptablesToolset::detect(false, None, &runner).expect("detect");
    assert_eq!(detected.v4.flavour, Flavour::Nft);

    // Forced to legacy: the rules land there, not in nft.
    let (config_a, options_a) = resolve(&ns, &format!("{IPT_A} --force-iptables-binary=legacy"));
    apply_rules(&config_a, &options_a, &runner).expect("install into legacy");
    assert!(has_istio_chains(&runner, "iptables-legacy-save"));
    assert!(!has_istio_chains(&runner, "iptables-nft-save"));
    // Legacy now holds rules, so detection picks it without being forced.
    let detected = IptablesToolset::detect(false, None, &runner).expect("detect");
    assert_eq!(detected.v4.flavour, Flavour::Legacy);
    assert_eq!(detected.v4.restore_args(), ["--noflush", "--wait=30"]);

    // Same flags: nothing written. Other flags without --reconcile: an error, nothing
    // written. With --reconcile: one restore that removes and re-adds.
    let (_, options_plain) = resolve(&ns, IPT_A);
    let before = runner.writes.borrow().len();
    apply_rules(&config_a, &options_plain, &runner).expect("idempotent re-run");
    assert_eq!(runner.writes.borrow().len(), before);
    let (config_b, options_b) = resolve(&ns, IPT_B);
    let err = apply_rules(&config_b, &options_b, &runner).unwrap_err();
    assert!(matches!(err, CaptureError::Drift { .. }), "{err}");
    assert_eq!(runner.writes.borrow().len(), before);
    let (config_b, options_b) = resolve(&ns, &format!("{IPT_B} --reconcile"));
    apply_rules(&config_b, &options_b, &runner).expect("reconcile");
    let writes = runner.writes.borrow();
    assert_eq!(writes.len(), before + 1, "one restore replaces the rules");
    let replacement = &writes[before];
    assert!(
        replacement.starts_with("iptables-legacy-restore: "),
        "{replacement}"
    );
    drop(writes);
    let saved = runner.run("iptables-legacy-save", &[], None).unwrap();
    assert!(
        saved.contains("--dport 8080") && !saved.contains("ISTIO_DROP"),
        "{saved}"
    );
    assert!(!saved.contains("10.10.0.0/16"), "{saved}");
    assert_eq!(
        saved.matches("-A OUTPUT -j ISTIO_OUTPUT").count(),
        1,
        "{saved}"
    );

    // --force-apply rewrites identical rules, still in one restore.
    let (_, forced) = resolve(&ns, &format!("{IPT_B} --force-apply"));
    let before = runner.writes.borrow().len();
    apply_rules(&config_b, &forced, &runner).expect("force apply");
    assert_eq!(runner.writes.borrow().len(), before + 1);
    assert_eq!(
        runner
            .run("iptables-legacy-save", &[], None)
            .unwrap()
            .matches("-A OUTPUT -j ISTIO_OUTPUT")
            .count(),
        1
    );

    // Cleanup (detecting legacy again) leaves no chain of ours in either flavour.
    let (_, cleanup) = resolve(&ns, &format!("{IPT_B} --cleanup-only"));
    apply_rules(&config_b, &cleanup, &runner).expect("cleanup");
    assert!(!has_istio_chains(&runner, "iptables-legacy-save"));
    assert!(!has_istio_chains(&runner, "iptables-nft-save"));

    // The nft flavour reconciles in one restore too.
    let (config_a, options_a) = resolve(&ns, &format!("{IPT_A} --force-iptables-binary=nft"));
    apply_rules(&config_a, &options_a, &runner).expect("install into nft");
    let (config_b, options_b) = resolve(
        &ns,
        &format!("{IPT_B} --force-iptables-binary=nft --reconcile"),
    );
    let before = runner.writes.borrow().len();
    apply_rules(&config_b, &options_b, &runner).expect("reconcile nft flavour");
    assert_eq!(runner.writes.borrow().len(), before + 1);
    let saved = runner.run("iptables-nft-save", &[], None).unwrap();
    assert!(
        saved.contains("--dport 8080") && !saved.contains("ISTIO_DROP"),
        "{saved}"
    );
}

#[test]
fn cleanup_that_sees_no_ipv6_still_removes_an_earlier_installs_ipv6_rules() {
    let tools: &[&[&str]] = &[&["iptables-nft-save"], &["ip6tables-nft-save"]];
    let Some(ns) = Netns::create_or_skip("cap-v6", tools) else {
        return;
    };
    let runner = ns.runner();
    // An install that saw the pod's IPv6 address (given here: the namespace has none).
    let (config, options) = resolve(&ns, &format!("{IPT_B} --dual-stack --assume-ipv6"));
    assert!(config.ipv6);
    apply_rules(&config, &options, &runner).expect("install both families");
    assert!(has_istio_chains(&runner, "ip6tables-nft-save"));
    // A cleanup that sees no IPv6 address, or is run without --dual-stack.
    let (plain, cleanup) = resolve(&ns, &format!("{IPT_B} --cleanup-only"));
    assert!(!plain.ipv6);
    apply_rules(&plain, &cleanup, &runner).expect("cleanup");
    assert!(!has_istio_chains(&runner, "iptables-nft-save"));
    assert!(
        !has_istio_chains(&runner, "ip6tables-nft-save"),
        "IPv6 rules left behind"
    );
}
