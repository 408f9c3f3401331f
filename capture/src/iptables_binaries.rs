//! Which iptables binaries to run: `iptables-legacy*` or `iptables-nft*` (Debian and most
//! images ship both), chosen as istio-iptables chooses them.
//!
//! Per IP family: the legacy set if it already holds rules in this namespace (someone there
//! uses it, and rules split over two backends would both apply), else the nft set if it can
//! program the nat table, else the unsuffixed `iptables`. `--force-iptables-binary` skips the
//! choice but not the check. "Holds rules" means `-A` lines in `*-save` output: istio-iptables
//! counts lines instead, which its own probe (a rule added to and removed from legacy's nat
//! table) makes true on every later run.
//!
//! The probe writes and removes one rule that can never match (protocol 255 in nat/INPUT), in
//! the namespace the runner works in; it is the only way to learn that the kernel side works.

use crate::error::CaptureError;
use crate::options::ForcedBinary;
use crate::rules::Family;
use crate::runner::Runner;

/// Legacy iptables takes a lock; from this version on, restore can wait for it.
const LEGACY_WAIT_SINCE: (u32, u32, u32) = (1, 6, 2);
/// How long legacy iptables may wait for the lock, as istio-iptables lets it.
const LEGACY_WAIT: &str = "--wait=30";
/// The probe rule: protocol 255 is reserved, so the rule never matches anything.
const PROBE_RULE: [&str; 8] = ["-t", "nat", "-A", "INPUT", "-p", "255", "-j", "RETURN"];

/// The kind of iptables binary set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `iptables-legacy`, `iptables-legacy-save`, `iptables-legacy-restore`.
    Legacy,
    /// `iptables-nft` and friends, the nf_tables backend.
    Nft,
    /// `iptables` and friends, whatever they point to.
    Unsuffixed,
}

impl Flavour {
    fn suffix(self) -> &'static str {
        match self {
            Flavour::Legacy => "-legacy",
            Flavour::Nft => "-nft",
            Flavour::Unsuffixed => "",
        }
    }
}

/// The iptables commands for one IP family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesCommands {
    /// Which set.
    pub flavour: Flavour,
    /// `iptables`, `ip6tables-legacy`, …
    pub iptables: String,
    /// The matching `*-save`.
    pub save: String,
    /// The matching `*-restore`.
    pub restore: String,
    /// Arguments every writing command gets (legacy's lock wait).
    pub write_args: Vec<String>,
}

impl IptablesCommands {
    /// One set of binaries, without lock waiting.
    pub fn new(family: Family, flavour: Flavour) -> Self {
        let base = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        let iptables = format!("{base}{}", flavour.suffix());
        IptablesCommands {
            flavour,
            save: format!("{iptables}-save"),
            restore: format!("{iptables}-restore"),
            iptables,
            write_args: Vec::new(),
        }
    }

    /// The unsuffixed binaries, used when nothing is detected (and by dry runs).
    pub fn unsuffixed(family: Family) -> Self {
        IptablesCommands::new(family, Flavour::Unsuffixed)
    }

    /// The restore arguments for writing: `--noflush` and, for legacy, the lock wait.
    pub fn restore_args(&self) -> Vec<&str> {
        std::iter::once("--noflush")
            .chain(self.write_args.iter().map(String::as_str))
            .collect()
    }
}

/// The binaries for both families.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesToolset {
    /// IPv4.
    pub v4: IptablesCommands,
    /// IPv6.
    pub v6: IptablesCommands,
}

impl IptablesToolset {
    /// The unsuffixed binaries for both families.
    pub fn unsuffixed() -> Self {
        IptablesToolset {
            v4: IptablesCommands::unsuffixed(Family::V4),
            v6: IptablesCommands::unsuffixed(Family::V6),
        }
    }

    /// The commands of one family.
    pub fn get(&self, family: Family) -> &IptablesCommands {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// Detects the binaries for IPv4 and, when `ipv6`, IPv6 (otherwise IPv6 keeps the
    /// unsuffixed set, which nothing will run).
    pub fn detect(
        ipv6: bool,
        forced: Option<ForcedBinary>,
        runner: &dyn Runner,
    ) -> Result<Self, CaptureError> {
        let v4 = detect(Family::V4, forced, runner)?;
        let v6 = if ipv6 {
            detect(Family::V6, forced, runner)?
        } else {
            IptablesCommands::unsuffixed(Family::V6)
        };
        Ok(IptablesToolset { v4, v6 })
    }
}

/// Why one binary set cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// The binaries are not installed.
    NotInstalled(String),
    /// The binaries run but cannot program the nat table (kernel support missing).
    NoNatTable(String),
    /// Something else failed.
    Failed(String),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NotInstalled(binary) => write!(f, "{binary} is not installed"),
            Unusable::NoNatTable(detail) => write!(f, "cannot program the nat table: {detail}"),
            Unusable::Failed(detail) => f.write_str(detail),
        }
    }
}

/// What probing one binary set found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The commands to use.
    pub commands: IptablesCommands,
    /// Whether rules already exist for this set in the namespace.
    pub has_rules: bool,
}

/// Chooses the binaries for one family (see the module documentation).
pub fn detect(
    family: Family,
    forced: Option<ForcedBinary>,
    runner: &dyn Runner,
) -> Result<IptablesCommands, CaptureError> {
    let unusable =
        |attempts: Vec<(String, Unusable)>, forced: bool| CaptureError::NoUsableIptables {
            family: family.label(),
            forced,
            attempts,
        };
    if let Some(forced) = forced {
        let flavour = match forced {
            ForcedBinary::Legacy => Flavour::Legacy,
            ForcedBinary::Nft => Flavour::Nft,
        };
        let name = IptablesCommands::new(family, flavour).iptables;
        return probe(family, flavour, runner)
            .map(|p| p.commands)
            .map_err(|why| unusable(vec![(name, why)], true));
    }
    let mut attempts = Vec::new();
    let mut idle_legacy = None;
    for flavour in [Flavour::Legacy, Flavour::Nft, Flavour::Unsuffixed] {
        match probe(family, flavour, runner) {
            // Legacy only when it is already in use; otherwise nft is preferred.
            Ok(p) if flavour == Flavour::Legacy && !p.has_rules => {
                tracing::debug!(binary = p.commands.iptables, "usable but holds no rules");
                idle_legacy = Some(p.commands);
            }
            Ok(p) => {
                tracing::info!(
                    family = family.label(),
                    binary = p.commands.iptables,
                    "using"
                );
                return Ok(p.commands);
            }
            Err(why) => {
                let name = IptablesCommands::new(family, flavour).iptables;
                tracing::debug!(binary = name, %why, "cannot use");
                attempts.push((name, why));
            }
        }
    }
    // Only legacy works (istio-iptables gives up here; using it is plainly better).
    idle_legacy.ok_or_else(|| unusable(attempts, false))
}

/// Checks one binary set: its save command runs, its version, and that it can add (and
/// remove) a rule in the nat table.
pub fn probe(family: Family, flavour: Flavour, runner: &dyn Runner) -> Result<Probe, Unusable> {
    let mut commands = IptablesCommands::new(family, flavour);
    let saved = runner
        .run(&commands.save, &[], None)
        .map_err(|e| match e.failure {
            crate::error::CommandFailure::Spawn(_) => Unusable::NotInstalled(commands.save.clone()),
            _ => Unusable::Failed(e.to_string()),
        })?;
    let has_rules = saved.lines().any(|l| l.starts_with("-A "));
    // Very old legacy saves reject --version; they are legacy without lock waiting then.
    let version = runner
        .run(&commands.save, &["--version"], None)
        .ok()
        .filter(|out| !out.contains("unrecognized option"));
    let legacy = match &version {
        Some(out) => !out.contains("nf_tables"),
        None => true,
    };
    let version = version
        .as_deref()
        .and_then(parse_version)
        .unwrap_or((0, 0, 0));
    if legacy && version >= LEGACY_WAIT_SINCE {
        commands.write_args.push(LEGACY_WAIT.to_owned());
    }
    let mut add: Vec<&str> = PROBE_RULE.to_vec();
    add.extend(commands.write_args.iter().map(String::as_str));
    if let Err(e) = runner.run(&commands.iptables, &add, None) {
        return Err(match e.failure {
            crate::error::CommandFailure::Spawn(_) => {
                Unusable::NotInstalled(commands.iptables.clone())
            }
            _ => Unusable::NoNatTable(e.stderr().unwrap_or("").to_owned()),
        });
    }
    add[2] = "-D";
    if let Err(e) = runner.run(&commands.iptables, &add, None) {
        tracing::warn!(error = %e, "could not remove the probe rule (it never matches)");
    }
    Ok(Probe {
        commands,
        has_rules,
    })
}

/// The first `vX.Y[.Z]` in a `--version` output.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    text.split_whitespace().find_map(|word| {
        let mut parts = word.strip_prefix('v')?.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        Some((major, minor, patch))
    })
}

#[cfg(test)]
#[path = "iptables_binaries_tests.rs"]
mod tests;
