//! The installer's decisions, driven through a fake [`Runner`] (the real thing is exercised
//! in a network namespace by `tests/netns.rs`).

use std::cell::RefCell;
use std::os::unix::process::ExitStatusExt;

use clap::Parser;

use super::*;
use crate::flags::{CaptureArgs, Environment};
use crate::generate::generate;
use crate::model::CaptureConfig;
use crate::pod_network::PodNetwork;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: CaptureArgs,
}

struct Ipv4Pod;

impl PodNetwork for Ipv4Pod {
    fn is_ipv6(&self, _: bool) -> Result<bool, CaptureError> {
        Ok(false)
    }
    fn nameservers(&self) -> Result<Vec<String>, CaptureError> {
        Ok(vec![])
    }
}

fn rules_for(argv: &[&str]) -> CaptureRules {
    let argv = std::iter::once("capture").chain(argv.iter().copied());
    let args = Cli::try_parse_from(argv).unwrap().args;
    generate(&CaptureConfig::resolve(&args, &Environment::default(), &Ipv4Pod).unwrap())
}

/// What iptables-save would print after installing `set` into otherwise empty tables
/// (rules in our own spelling, which is enough for the counting checks).
fn as_saved(set: &RuleSet, extra: &str) -> String {
    let mut out = String::new();
    for table in set.tables() {
        out.push_str(&format!("*{}\n", table.name()));
        for chain in ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"] {
            out.push_str(&format!(":{chain} ACCEPT [0:0]\n"));
        }
        for chain in set.declared_chains(table) {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for rule in set.in_table(table) {
            out.push_str(&format!("-A {} {}\n", rule.chain, rule.spec));
        }
        if table == Table::Nat {
            out.push_str(extra);
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// A runner that answers `*-save` with canned text and `-C` checks with a canned verdict,
/// and records every call.
struct Fake {
    saved: String,
    checks_pass: bool,
    calls: RefCell<Vec<(String, Option<String>)>>,
}

impl Fake {
    fn new(saved: impl Into<String>, checks_pass: bool) -> Self {
        Fake {
            saved: saved.into(),
            checks_pass,
            calls: RefCell::new(Vec::new()),
        }
    }

    /// The stdin of every restore call that is not a check.
    fn writes(&self) -> Vec<String> {
        let calls = self.calls.borrow();
        let writes = calls.iter().filter_map(|(_, stdin)| stdin.clone());
        writes.filter(|s| !s.contains("\n-C ")).collect()
    }
}

impl Runner for Fake {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, CommandError> {
        self.calls
            .borrow_mut()
            .push((program.to_owned(), stdin.map(str::to_owned)));
        if program.ends_with("-save") {
            return Ok(self.saved.clone());
        }
        assert_eq!(args[0], "--noflush");
        if stdin.is_some_and(|s| s.contains("\n-C ")) && !self.checks_pass {
            return Err(CommandError {
                command: program.to_owned(),
                failure: CommandFailure::Exit {
                    status: std::process::ExitStatus::from_raw(256),
                    stderr: "Bad rule (does a matching rule exist in that chain?)".to_owned(),
                },
            });
        }
        Ok(String::new())
    }
}

const FOREIGN: &str = ":FOREIGN - [0:0]\n-A OUTPUT -j FOREIGN\n-A FOREIGN -j RETURN\n";

#[test]
fn fresh_install_writes_exactly_the_dry_run_input() {
    let rules = rules_for(&["-b", "*", "-i", "*"]);
    let fake = Fake::new("*nat\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n", true);
    assert_eq!(install(&rules, &fake).unwrap(), [Installed::Fresh]);
    assert_eq!(fake.writes(), [rules.v4.restore_input()]);
    let programs: Vec<String> = fake.calls.borrow().iter().map(|c| c.0.clone()).collect();
    assert_eq!(programs, ["iptables-save", "iptables-restore"]);
}

#[test]
fn identical_installation_is_left_alone() {
    let rules = rules_for(&["-b", "*", "-i", "*"]);
    let fake = Fake::new(as_saved(&rules.v4, FOREIGN), true);
    assert_eq!(install(&rules, &fake).unwrap(), [Installed::Unchanged]);
    assert!(fake.writes().is_empty());
}

#[test]
fn different_installation_is_replaced_in_one_restore() {
    let old = rules_for(&["-b", "*", "-i", "*"]);
    let new = rules_for(&["-b", "8080,9090", "-i", "*", "--drop-invalid"]);
    let fake = Fake::new(as_saved(&old.v4, FOREIGN), true);
    assert_eq!(install(&new, &fake).unwrap(), [Installed::Replaced]);
    let writes = fake.writes();
    assert_eq!(writes.len(), 1, "removal and re-adding are one transaction");
    let input = &writes[0];
    assert!(input.starts_with("*mangle\n-N ISTIO_DROP\n"), "{input}");
    let nat = &input[input.find("*nat\n").unwrap()..];
    for line in [
        "-D PREROUTING -p tcp -j ISTIO_INBOUND\n",
        "-D OUTPUT -j ISTIO_OUTPUT\n",
        "-F ISTIO_INBOUND\n",
        "-A ISTIO_INBOUND -p tcp --dport 8080 -j ISTIO_IN_REDIRECT\n",
        "-A OUTPUT -j ISTIO_OUTPUT\n",
    ] {
        assert!(nat.contains(line), "{line:?} missing from {nat}");
    }
    // Chains that stay are flushed, not deleted and re-created.
    assert!(!nat.contains("-X ISTIO_INBOUND") && !nat.contains("-N ISTIO_INBOUND"));
    assert!(!input.contains("FOREIGN"), "foreign rules stay: {input}");
    let first = |needle: &str| nat.find(needle).unwrap();
    assert!(first("-D ") < first("-F ") && first("-F ") < first("-A "));
    assert_eq!(nat.matches("COMMIT").count(), 1);
}

#[test]
fn chains_no_longer_wanted_are_deleted_when_replacing() {
    let old = rules_for(&["-b", "*", "-i", "*", "--drop-invalid"]);
    let new = rules_for(&["-b", "*", "-i", "*"]);
    let fake = Fake::new(as_saved(&old.v4, ""), true);
    assert_eq!(install(&new, &fake).unwrap(), [Installed::Replaced]);
    let input = fake.writes().concat();
    assert!(input.contains("*mangle\n-D PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP\n-F ISTIO_DROP\n-X ISTIO_DROP\nCOMMIT\n"), "{input}");
}

#[test]
fn drift_without_reconcile_is_an_error_and_changes_nothing() {
    let old = rules_for(&["-b", "*", "-i", "*"]);
    let new = rules_for(&["-b", "8080,9090", "-i", "*"]);
    let fake = Fake::new(as_saved(&old.v4, ""), true);
    let options = InstallOptions {
        reconcile: false,
        force_apply: false,
    };
    let tools = IptablesToolset::unsuffixed();
    let err = install_with(&new, &tools, options, &fake).unwrap_err();
    assert!(
        matches!(err, CaptureError::Drift { family: "IPv4" }),
        "{err}"
    );
    assert!(err.to_string().contains("--reconcile"), "{err}");
    assert!(fake.writes().is_empty());
    // Identical rules need no reconcile.
    let fake = Fake::new(as_saved(&new.v4, ""), true);
    let done = install_with(&new, &tools, options, &fake).unwrap();
    assert_eq!(done, [Installed::Unchanged]);
}

#[test]
fn force_apply_rewrites_identical_rules() {
    let rules = rules_for(&["-b", "*", "-i", "*"]);
    let fake = Fake::new(as_saved(&rules.v4, ""), true);
    let options = InstallOptions {
        reconcile: false,
        force_apply: true,
    };
    let done = install_with(&rules, &IptablesToolset::unsuffixed(), options, &fake).unwrap();
    assert_eq!(done, [Installed::Replaced]);
    assert_eq!(fake.writes().len(), 1);
}

#[test]
fn detected_binaries_and_lock_wait_are_used() {
    let rules = rules_for(&[]);
    let mut tools = IptablesToolset::unsuffixed();
    tools.v4 = crate::iptables_binaries::IptablesCommands::new(
        Family::V4,
        crate::iptables_binaries::Flavour::Legacy,
    );
    tools.v4.write_args.push("--wait=30".to_owned());
    let fake = Fake::new("", true);
    let options = InstallOptions {
        reconcile: false,
        force_apply: false,
    };
    install_with(&rules, &tools, options, &fake).unwrap();
    let calls = fake.calls.borrow();
    let programs: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        programs,
        ["iptables-legacy-save", "iptables-legacy-restore"]
    );
}

#[test]
fn rules_that_iptables_does_not_confirm_are_replaced() {
    let rules = rules_for(&["-b", "*"]);
    let fake = Fake::new(as_saved(&rules.v4, ""), false);
    assert_eq!(install(&rules, &fake).unwrap(), [Installed::Replaced]);
}

#[test]
fn cleanup_removes_own_chains_jumps_and_confirmed_loose_rules() {
    let rules = rules_for(&["-b", "*", "-c", "eth9"]);
    let fake = Fake::new(as_saved(&rules.v4, FOREIGN), true);
    cleanup(&rules, &fake).unwrap();
    let writes = fake.writes();
    assert_eq!(writes.len(), 1);
    let removal = &writes[0];
    assert!(
        removal.contains("-D PREROUTING -i eth9 -j RETURN\n"),
        "{removal}"
    );
    assert!(
        removal.contains("-D OUTPUT -o eth9 -j RETURN\n"),
        "{removal}"
    );
    assert!(removal.contains("-X ISTIO_OUTPUT\n"), "{removal}");
    assert!(!removal.contains("FOREIGN"), "{removal}");
    // Deletions come before flushes, flushes before chain removal.
    let first = |needle: &str| removal.find(needle).unwrap();
    assert!(first("-D ") < first("-F ") && first("-F ") < first("-X "));
}

#[test]
fn cleanup_skips_loose_rules_iptables_does_not_find() {
    let rules = rules_for(&["-c", "eth9"]);
    let fake = Fake::new(as_saved(&rules.v4, ""), false);
    cleanup(&rules, &fake).unwrap();
    let removal = fake.writes().concat();
    assert!(!removal.contains("eth9"), "{removal}");
    assert!(removal.contains("-X ISTIO_OUTPUT\n"), "{removal}");
}

#[test]
fn cleanup_with_nothing_installed_writes_nothing() {
    let rules = rules_for(&[]);
    let fake = Fake::new(
        "*nat\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -j RETURN\nCOMMIT\n",
        false,
    );
    cleanup(&rules, &fake).unwrap();
    assert!(fake.writes().is_empty());
}

#[test]
fn a_foreign_chain_jumping_into_ours_stops_removal_but_not_replacement() {
    let rules = rules_for(&[]);
    let extra = ":FOREIGN - [0:0]\n-A FOREIGN -j ISTIO_OUTPUT\n";
    let fake = Fake::new(as_saved(&rules.v4, extra), true);
    let err = cleanup(&rules, &fake).unwrap_err();
    assert!(
        matches!(err, CaptureError::ForeignReference { ref chain, .. } if chain == "FOREIGN"),
        "{err}"
    );
    assert!(fake.writes().is_empty());
    // Replacing keeps ISTIO_OUTPUT (flushed), so the foreign jump stays valid.
    let new = rules_for(&["-b", "*"]);
    assert_eq!(install(&new, &fake).unwrap(), [Installed::Replaced]);
    assert!(!fake.writes().concat().contains("FOREIGN"));
}

#[test]
fn ipv6_pods_get_both_families_in_order() {
    let mut rules = rules_for(&[]);
    rules.v6 = Some(rules.v4.clone());
    let fake = Fake::new("", true);
    assert_eq!(
        install(&rules, &fake).unwrap(),
        [Installed::Fresh, Installed::Fresh]
    );
    let programs: Vec<String> = fake.calls.borrow().iter().map(|c| c.0.clone()).collect();
    let expected = [
        "iptables-save",
        "iptables-restore",
        "ip6tables-save",
        "ip6tables-restore",
    ];
    assert_eq!(programs, expected);
}
