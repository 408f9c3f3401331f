//! Installs, re-installs and removes real rules inside a network namespace created for the
//! test (never the machine's own), through `ip netns exec`.
//!
//! Needs root, iproute2 and iptables. Without them it is skipped with a message, except
//! under CI=true, where it fails instead.

mod support;

use remora_capture::apply::{self, Installed};
use remora_capture::{generate, host_net, CaptureConfig, CaptureRules, Environment, Runner};
use support::{parse_args, Netns, NoDiscovery};

fn namespace_or_skip() -> Option<Netns> {
    Netns::create_or_skip("cap-test", &[&["iptables-save"], &["ip6tables-save"]])
}

fn config(flags: &str) -> CaptureConfig {
    let argv = shlex::split(flags).expect("shell words");
    let args = parse_args(&argv).expect("flags parse");
    CaptureConfig::resolve(&args, &Environment::default(), &NoDiscovery).expect("resolves")
}

/// Rules and user chains of both families, one "family table: line" each, without counters
/// and without built-in chain declarations (tables, once created, stay).
fn snapshot(runner: &dyn Runner) -> Vec<String> {
    let mut lines = Vec::new();
    for save in ["iptables-save", "ip6tables-save"] {
        let text = runner.run(save, &[], None).expect("save");
        let mut table = "";
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name;
            } else if line.starts_with("-A ") || (line.starts_with(':') && line.contains(" - ")) {
                let line = line.split(" [").next().unwrap_or(line);
                lines.push(format!("{save} {table}: {line}"));
            }
        }
    }
    lines
}

fn count(snapshot: &[String], needle: &str) -> usize {
    snapshot.iter().filter(|l| l.contains(needle)).count()
}

const FOREIGN_V4: &str =
    "*nat\n-N FOREIGN\n-A OUTPUT -j FOREIGN\n-A FOREIGN -p tcp --dport 9999 -j RETURN\n\
                          -A PREROUTING -i foreign0 -j ACCEPT\nCOMMIT\n\
                          *mangle\n-A OUTPUT -o foreign0 -j ACCEPT\nCOMMIT\n";
const FOREIGN_V6: &str = "*nat\n-N FOREIGN\n-A OUTPUT -j FOREIGN\nCOMMIT\n";

// TPROXY, DNS, -c, -k and --drop-invalid together put rules in every table and in built-in
// chains, in both families.
const FLAGS_A: &str = "-p 15001 -z 15006 -u 1337 -m TPROXY -b '*' -d 15090,15021 -i '*' \
                       -x 10.10.0.0/16 -c eth9 -k eth8 --redirect-dns \
                       --dns-servers=10.96.0.10,fd00::10 --drop-invalid --assume-ipv6";
const FLAGS_B: &str = "-p 15001 -z 15006 -u 1337 -m TPROXY -b 8080,9090 -i '*' \
                       -c eth9 -k eth8 --redirect-dns --dns-servers=10.96.0.10 --drop-invalid \
                       --assume-ipv6";

#[test]
fn install_reinstall_replace_and_cleanup_in_a_namespace() {
    let Some(ns) = namespace_or_skip() else {
        return;
    };
    let runner = ns.runner();
    runner
        .run("iptables-restore", &["--noflush"], Some(FOREIGN_V4))
        .unwrap();
    runner
        .run("ip6tables-restore", &["--noflush"], Some(FOREIGN_V6))
        .unwrap();
    let baseline = snapshot(&runner);
    assert_eq!(count(&baseline, "ISTIO_"), 0);

    let (config_a, config_b) = (config(FLAGS_A), config(FLAGS_B));
    let (rules_a, rules_b): (CaptureRules, CaptureRules) =
        (generate(&config_a), generate(&config_b));

    let fresh = apply::install(&rules_a, &runner).expect("first install");
    assert_eq!(fresh, [Installed::Fresh, Installed::Fresh]);
    let installed_a = snapshot(&runner);
    for chain in [
        "ISTIO_OUTPUT",
        "ISTIO_DIVERT",
        "ISTIO_OUTPUT_DNS",
        "ISTIO_DROP",
    ] {
        assert!(
            count(&installed_a, &format!(": :{chain} -")) >= 2,
            "{chain} in both families"
        );
    }
    assert_eq!(
        count(
            &installed_a,
            "iptables-save nat: -A PREROUTING -i eth9 -j RETURN"
        ),
        1
    );

    // Same flags again: recognised and left alone.
    let again = apply::install(&rules_a, &runner).expect("second install");
    assert_eq!(again, [Installed::Unchanged, Installed::Unchanged]);
    assert_eq!(snapshot(&runner), installed_a);

    // Other flags: the old installation is replaced, without leftovers or duplicates.
    let replaced = apply::install(&rules_b, &runner).expect("replacing install");
    assert_eq!(replaced, [Installed::Replaced, Installed::Replaced]);
    let installed_b = snapshot(&runner);
    assert_eq!(
        count(
            &installed_b,
            "iptables-save nat: -A PREROUTING -i eth9 -j RETURN"
        ),
        1
    );
    assert_eq!(count(&installed_b, "10.10.0.0/16"), 0, "old exclusion gone");
    assert_eq!(
        count(&installed_b, "--dport 8080"),
        4,
        "new ports in both families"
    );

    // The pod network setup TPROXY and IPv6 need, twice to show it tolerates a re-run.
    host_net::configure(&config_b, &runner).expect("host network setup");
    host_net::configure(&config_b, &runner).expect("host network setup again");
    let rules = runner.run("ip", &["-4", "rule"], None).unwrap();
    assert_eq!(
        rules.matches("fwmark 0x539 lookup 133").count(),
        1,
        "{rules}"
    );
    let addrs = runner
        .run("ip", &["-6", "addr", "show", "dev", "lo"], None)
        .unwrap();
    assert!(addrs.contains("::6/128"), "{addrs}");

    // Cleanup leaves exactly what was there before, foreign rules and chains included.
    apply::cleanup(&rules_b, &runner).expect("cleanup");
    assert_eq!(snapshot(&runner), baseline);
    apply::cleanup(&rules_b, &runner).expect("cleanup with nothing to do");
    assert_eq!(snapshot(&runner), baseline);

    // A fresh install of B matches what replacing A with B produced.
    apply::install(&rules_b, &runner).expect("fresh install of B");
    let mut fresh_b = snapshot(&runner);
    let mut replaced_b = installed_b;
    fresh_b.sort();
    replaced_b.sort();
    assert_eq!(fresh_b, replaced_b);
    apply::cleanup(&rules_b, &runner).expect("final cleanup");
}
