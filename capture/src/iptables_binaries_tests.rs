//! Binary detection against a scripted machine.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;

use super::*;
use crate::error::{CommandError, CommandFailure};

/// A machine where each binary set is missing, broken (no nat table), or working with or
/// without rules; records every command line.
#[derive(Default)]
struct Machine {
    sets: BTreeMap<&'static str, SetState>,
    calls: RefCell<Vec<String>>,
}

#[derive(Clone, Copy)]
enum SetState {
    NoNat,
    Empty,
    WithRules,
}

impl Machine {
    fn with(mut self, binary: &'static str, state: SetState) -> Self {
        self.sets.insert(binary, state);
        self
    }
}

fn exit(program: &str, stderr: &str) -> CommandError {
    CommandError {
        command: program.to_owned(),
        failure: CommandFailure::Exit {
            status: std::process::ExitStatus::from_raw(256),
            stderr: stderr.to_owned(),
        },
    }
}

impl Runner for Machine {
    fn run(&self, program: &str, args: &[&str], _: Option<&str>) -> Result<String, CommandError> {
        self.calls
            .borrow_mut()
            .push(format!("{program} {}", args.join(" ")));
        let base = program
            .strip_suffix("-save")
            .or_else(|| program.strip_suffix("-restore"))
            .unwrap_or(program);
        let Some(state) = self.sets.get(base).copied() else {
            return Err(CommandError {
                command: program.to_owned(),
                failure: CommandFailure::Spawn(std::io::ErrorKind::NotFound.into()),
            });
        };
        let nft = base.ends_with("-nft");
        match (program.ends_with("-save"), args) {
            (true, ["--version"]) if nft => Ok(format!("{program} v1.8.9 (nf_tables)\n")),
            (true, ["--version"]) => Ok(format!("{program} v1.8.9 (legacy)\n")),
            (true, _) => Ok(match state {
                SetState::WithRules => "*nat\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -j X\nCOMMIT\n",
                // Line count alone would call this "in use".
                _ => "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
            }
            .to_owned()),
            (false, _) => match state {
                SetState::NoNat => Err(exit(
                    program,
                    "can't initialize iptables table `nat': Table does not exist",
                )),
                _ => Ok(String::new()),
            },
        }
    }
}

#[test]
fn prefers_legacy_only_when_it_holds_rules() {
    let m = Machine::default()
        .with("iptables-legacy", SetState::WithRules)
        .with("iptables-nft", SetState::Empty);
    let c = detect(Family::V4, None, &m).unwrap();
    assert_eq!(c.flavour, Flavour::Legacy);
    assert_eq!(c.restore_args(), ["--noflush", "--wait=30"]);

    let m = Machine::default()
        .with("iptables-legacy", SetState::Empty)
        .with("iptables-nft", SetState::Empty);
    let c = detect(Family::V4, None, &m).unwrap();
    assert_eq!(c.flavour, Flavour::Nft);
    assert_eq!(
        (c.iptables.as_str(), c.save.as_str(), c.restore.as_str()),
        ("iptables-nft", "iptables-nft-save", "iptables-nft-restore")
    );
    assert_eq!(c.restore_args(), ["--noflush"]);
}

#[test]
fn the_probe_rule_is_added_and_removed() {
    let m = Machine::default().with("ip6tables-nft", SetState::Empty);
    let c = detect(Family::V6, None, &m).unwrap();
    assert_eq!(c.iptables, "ip6tables-nft");
    let calls = m.calls.borrow();
    let add = "ip6tables-nft -t nat -A INPUT -p 255 -j RETURN";
    let del = "ip6tables-nft -t nat -D INPUT -p 255 -j RETURN";
    let at = |cmd: &str| calls.iter().position(|c| c == cmd).unwrap();
    assert!(at(add) < at(del), "{calls:?}");
}

#[test]
fn falls_back_to_unsuffixed_then_to_idle_legacy() {
    let m = Machine::default()
        .with("iptables-nft", SetState::NoNat)
        .with("iptables", SetState::Empty);
    assert_eq!(
        detect(Family::V4, None, &m).unwrap().flavour,
        Flavour::Unsuffixed
    );
    let m = Machine::default()
        .with("iptables-legacy", SetState::Empty)
        .with("iptables-nft", SetState::NoNat);
    assert_eq!(
        detect(Family::V4, None, &m).unwrap().flavour,
        Flavour::Legacy
    );
}

#[test]
fn forcing_skips_the_choice_but_not_the_check() {
    let m = Machine::default()
        .with("iptables-legacy", SetState::WithRules)
        .with("iptables-nft", SetState::Empty);
    let c = detect(Family::V4, Some(ForcedBinary::Nft), &m).unwrap();
    assert_eq!(c.flavour, Flavour::Nft);
    let m = Machine::default().with("iptables-nft", SetState::Empty);
    let err = detect(Family::V4, Some(ForcedBinary::Legacy), &m).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("forced with --force-iptables-binary"), "{msg}");
    assert!(
        msg.contains("iptables-legacy-save is not installed"),
        "{msg}"
    );
}

#[test]
fn no_nat_table_is_one_clear_error() {
    let m = Machine::default()
        .with("iptables-legacy", SetState::NoNat)
        .with("iptables-nft", SetState::NoNat)
        .with("iptables", SetState::NoNat);
    let msg = detect(Family::V4, None, &m).unwrap_err().to_string();
    assert!(
        msg.starts_with("cannot install IPv4 capture rules:"),
        "{msg}"
    );
    assert!(msg.contains("no usable nat table"), "{msg}");
    assert!(msg.contains("iptables-nft: cannot program the nat table: can't initialize"));
    let msg = detect(Family::V4, None, &Machine::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no iptables binaries are installed"), "{msg}");
}

#[test]
fn versions() {
    assert_eq!(
        parse_version("iptables-save v1.8.9 (legacy)"),
        Some((1, 8, 9))
    );
    assert_eq!(parse_version("iptables v1.6 (legacy)"), Some((1, 6, 0)));
    assert_eq!(parse_version("no version"), None);
}
