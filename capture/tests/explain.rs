//! `remora capture explain` on the conformance rules (istio-iptables' and Istio's nftables
//! text), and checked against the kernel: the rules of a case are restored into a network
//! namespace created for the test, the described connection is made there, and the rules
//! whose packet counters moved must be exactly the ones explain says match.
//!
//! The kernel test needs root, iproute2 and iptables; it is skipped with a message without
//! them, except under CI=true, where it fails instead.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use remora_capture::explain::model::{Action, Family, Proto, Ruleset, Test};
use remora_capture::explain::parse_rules;
use remora_capture::explain::trace::{trace, Connection, Direction, Outcome};
use remora_capture::Runner;
use support::{case_names, cases_dir, Netns};

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).expect("read case")
}

fn outbound(uid: u32, dst: &str, dport: u16, out: &str) -> Connection {
    Connection {
        direction: Direction::Outbound,
        proto: Proto::Tcp,
        src: None,
        dst: Some(dst.parse().expect("valid test input")),
        sport: None,
        dport: Some(dport),
        uid: Some(uid),
        gid: Some(uid),
        in_iface: None,
        out_iface: Some(out.to_owned()),
        mark: 0,
    }
}

fn inbound(src: &str, dst: &str, dport: u16) -> Connection {
    Connection {
        direction: Direction::Inbound,
        proto: Proto::Tcp,
        src: Some(src.parse().expect("valid test input")),
        dst: Some(dst.parse().expect("valid test input")),
        sport: None,
        dport: Some(dport),
        uid: None,
        gid: None,
        in_iface: Some("eth0".to_owned()),
        out_iface: None,
        mark: 0,
    }
}

/// The brief's examples, on istio-iptables' own text for default-sidecar.
#[test]
fn default_sidecar_as_istio_iptables_wrote_it() {
    let Some(dir) = cases_dir("capture") else {
        return;
    };
    let rules = parse_rules(&read(&dir, "default-sidecar.rules"), Family::V4);
    let port = |c: &Connection| match trace(&rules, c).outcome {
        Outcome::Redirected { port, .. } => Some(port),
        Outcome::Untouched => None,
        other => panic!("{other:?}\n{}", trace(&rules, c)),
    };
    assert_eq!(port(&outbound(1000, "10.0.0.1", 80, "eth0")), Some(15001));
    assert_eq!(port(&outbound(1337, "10.0.0.1", 80, "eth0")), None);
    assert_eq!(port(&inbound("10.1.0.5", "10.1.0.9", 15021)), None);
    assert_eq!(port(&inbound("10.1.0.5", "10.1.0.9", 8080)), Some(15006));
    let mut passthrough = outbound(1337, "10.1.0.9", 8080, "lo");
    passthrough.src = Some("127.0.0.6".parse().unwrap());
    assert_eq!(port(&passthrough), None);
}

/// Every rule in every conformance file is understood (no unknown match or action), and a
/// trace through each ends somewhere definite or names what it lacks.
#[test]
fn every_conformance_file_parses_completely() {
    for (folder, ext) in [("capture", "rules"), ("capture-nft", "nft")] {
        let Some(dir) = cases_dir(folder) else { return };
        for case in case_names(&dir, ext) {
            let text = read(&dir, &format!("{case}.{ext}"));
            for family in [Family::V4, Family::V6] {
                let rules = parse_rules(&text, family);
                assert_no_unknowns(&rules, &format!("{folder}/{case}"));
                let dst = if family == Family::V4 {
                    "10.0.0.1"
                } else {
                    "fd00::1"
                };
                for conn in [outbound(1000, dst, 80, "eth0"), inbound(dst, dst, 8080)] {
                    let t = trace(&rules, &conn);
                    if let Outcome::Unknown { reason, .. } = &t.outcome {
                        assert!(
                            reason.contains("not given") || reason.contains("resolve"),
                            "{folder}/{case}: {t}"
                        );
                    }
                }
            }
        }
    }
}

fn assert_no_unknowns(rules: &Ruleset, case: &str) {
    for table in &rules.tables {
        for chain in &table.chains {
            for rule in &chain.rules {
                let unknown_match = rule
                    .matches
                    .iter()
                    .any(|m| matches!(m.test, Test::Unknown(_)));
                let unknown_action = rule.actions.iter().any(|a| matches!(a, Action::Unknown(_)));
                assert!(
                    !unknown_match && !unknown_action,
                    "{case}: not understood: {}",
                    rule.text
                );
            }
        }
    }
}

/// Restores `text` (restore input) into the namespace with the plain iptables binaries.
fn restore(ns: &Netns, text: &str) {
    ns.runner()
        .run("iptables-restore", &["--noflush"], Some(text))
        .expect("restore the case's rules");
}

/// (table, chain, 1-based index) of every rule whose packet counter is not zero.
fn counted(ns: &Netns) -> Vec<(String, String, usize)> {
    let saved = ns
        .runner()
        .run("iptables-save", &["-c"], None)
        .expect("save -c");
    let rules = parse_rules(&saved, Family::V4);
    let mut hit = Vec::new();
    for table in &rules.tables {
        for chain in &table.chains {
            for (i, rule) in chain.rules.iter().enumerate() {
                if rule.packets.unwrap_or(0) > 0 {
                    hit.push((table.name.clone(), chain.name.clone(), i + 1));
                }
            }
        }
    }
    hit.sort();
    hit
}

fn zero_counters(ns: &Netns) {
    ns.runner()
        .run("iptables", &["-t", "nat", "-Z"], None)
        .expect("zero counters");
}

/// Opens a TCP connection inside `ns` as `uid` (or as this process), waiting at most a
/// moment: the outcome does not matter, only the packets the rules saw.
fn connect(ns: &Netns, from: Option<&str>, to: SocketAddr, uid: Option<u32>) {
    let from: Option<IpAddr> = from.map(|a| a.parse().expect("valid test input"));
    remora_capture::netns::run_in(Some(&ns.path()), move || {
        let old = uid.map(|u| {
            let g = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(u));
            (nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u)), g)
        });
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None);
        if let Some((u, g)) = old {
            nix::unistd::setfsuid(u);
            nix::unistd::setfsgid(g);
        }
        let socket = socket.expect("socket");
        if let Some(from) = from {
            socket.bind(&SocketAddr::new(from, 0).into()).expect("bind");
        }
        let _ = socket.connect_timeout(&to.into(), Duration::from_millis(300));
    })
    .expect("enter the namespace");
}

fn sorted(mut v: Vec<(String, String, usize)>) -> Vec<(String, String, usize)> {
    v.sort();
    v.dedup();
    v
}

#[test]
fn explain_agrees_with_the_kernel_counters() {
    let Some(dir) = cases_dir("capture") else {
        return;
    };
    let tools: &[&[&str]] = &[&["iptables-save"]];
    let Some(pod) = Netns::create_or_skip("cap-explain", tools) else {
        return;
    };
    let Some(client) = Netns::create_or_skip("cap-explain-cli", tools) else {
        return;
    };
    // The pod's eth0 faces a client namespace; 10.0.0.0/24 routes out through it too.
    let setup: &[&[&str]] = &[
        &[
            "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
        ],
        &["link", "set", "peer0", "netns", &client.name],
        &["addr", "add", "10.99.0.2/24", "dev", "eth0"],
        &["link", "set", "eth0", "up"],
        &["route", "add", "10.0.0.0/24", "via", "10.99.0.1"],
    ];
    for args in setup {
        pod.runner().run("ip", args, None).expect("pod network");
    }
    for args in [
        &["addr", "add", "10.99.0.1/24", "dev", "peer0"][..],
        &["link", "set", "peer0", "up"],
    ] {
        client
            .runner()
            .run("ip", args, None)
            .expect("client network");
    }

    let text = read(&dir, "default-sidecar.rules");
    restore(&pod, &text);
    let file_rules = parse_rules(&text, Family::V4);

    let cases = [
        (
            "outbound as uid 1000",
            outbound(1000, "10.0.0.1", 80, "eth0"),
            Side::Pod(Some(1000)),
        ),
        (
            "outbound as uid 1337",
            outbound(1337, "10.0.0.1", 80, "eth0"),
            Side::Pod(Some(1337)),
        ),
        (
            "inbound to 8080",
            inbound("10.99.0.1", "10.99.0.2", 8080),
            Side::Client,
        ),
        (
            "inbound to 15021",
            inbound("10.99.0.1", "10.99.0.2", 15021),
            Side::Client,
        ),
    ];
    for (name, conn, side) in cases {
        zero_counters(&pod);
        let to = SocketAddr::new(conn.dst.unwrap(), conn.dport.unwrap());
        match side {
            Side::Pod(uid) => connect(&pod, None, to, uid),
            Side::Client => connect(&client, Some("10.99.0.1"), to, None),
        }
        let kernel = counted(&pod);
        assert!(!kernel.is_empty(), "{name}: the connection reached no rule");
        let t = trace(&file_rules, &conn);
        assert!(!matches!(t.outcome, Outcome::Unknown { .. }), "{name}: {t}");
        assert_eq!(
            sorted(t.matched_rules()),
            kernel,
            "{name}: explain said\n{t}"
        );
        // Explaining the installed rules (as read back) gives the same path.
        let saved = pod.runner().run("iptables-save", &[], None).unwrap();
        let installed = trace(&parse_rules(&saved, Family::V4), &conn);
        assert_eq!(installed.outcome, t.outcome, "{name}");
    }
}

enum Side {
    Pod(Option<u32>),
    Client,
}

/// `explain --check` (and a trace) reading back what `remora capture` installed in a
/// namespace, with each backend.
#[test]
fn check_compares_installed_rules_with_flags() {
    use remora_capture::options::RunOptions;
    use remora_capture::{apply_rules, system_runner, CaptureCommand, CaptureConfig, Environment};
    let tools: &[&[&str]] = &[&["iptables-save"], &["nft", "list", "ruleset"]];
    let Some(ns) = Netns::create_or_skip("cap-check", tools) else {
        return;
    };
    let netns = format!("--network-namespace={}", ns.path().display());
    let explain = |argv: &[&str]| {
        let mut full = vec![netns.as_str(), "explain"];
        full.extend_from_slice(argv);
        let args = support::parse_args(&full).expect("flags parse");
        let Some(CaptureCommand::Explain(e)) = args.command.clone() else {
            panic!("no explain subcommand")
        };
        remora_capture::explain::run(&e, &args, &Environment::default())
    };
    for backend in [&[][..], &["--native-nftables"][..]] {
        let mut flags = vec!["-b", "*", "-i", "*"];
        flags.extend_from_slice(backend);
        let mut install = flags.clone();
        install.push(&netns);
        let args = support::parse_args(&install).expect("flags parse");
        let env = Environment::default();
        let options = RunOptions::resolve(&args, &env).expect("options");
        let config = CaptureConfig::resolve(&args, &env, &support::NoDiscovery).expect("config");
        apply_rules(&config, &options, &system_runner(&options)).expect("install");

        let mut check = vec!["--check"];
        check.extend_from_slice(&flags);
        explain(&check).expect("installed rules match the flags that wrote them");
        check.extend(["-d", "15021"]);
        let err = explain(&check).expect_err("an exclusion is missing");
        assert!(err.to_string().contains("differ"), "{err}");
        let trace = [
            "--direction",
            "outbound",
            "--uid",
            "1000",
            "--dst",
            "10.0.0.1",
            "--dport",
            "80",
        ];
        explain(&trace).expect("trace the installed rules");

        let cleanup = RunOptions {
            action: remora_capture::Action::CleanupOnly,
            ..options.clone()
        };
        apply_rules(&config, &cleanup, &system_runner(&options)).expect("cleanup");
    }
}
