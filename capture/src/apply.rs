//! Installing and removing the iptables rules: the thin layer between the generator and
//! iptables.
//!
//! Per IP family, IPv4 first, with the binaries [`crate::iptables_binaries`] chose:
//! - **install** reads the installed state with `*-save`. Without any `ISTIO_*` chain it
//!   writes the rules with one `*-restore --noflush`, whose input is exactly what `--dry-run`
//!   prints. If our chains exist and hold exactly the wanted rules (same chains, same rule
//!   counts, and every rule confirmed by iptables' own `-C` matching), it changes nothing.
//!   If they differ, it fails unless asked to reconcile (as istio-iptables does, though it
//!   fails less clearly), and with `--reconcile` (or `--force-apply`) it replaces them with
//!   one restore per family that deletes, flushes and re-adds in the same transaction, so
//!   there is never a moment with the old rules gone and the new ones missing.
//! - **cleanup** removes what we own: every `ISTIO_*` chain, the jumps into them from built-in
//!   chains, and the rules the current flags put straight into built-in chains (the RETURNs
//!   for `-c`/`-k` and the TPROXY marks), found with `-C`. Everything else is left alone; a
//!   user chain that jumps into a chain we delete is an error rather than something we
//!   silently edit.
//!
//! Rules in built-in chains that jump nowhere of ours can only be recognised by content, so
//! only those the current flags would write are removed: after `-c eth9` becomes `-c eth8`,
//! the old `-i eth9 -j RETURN` stays (as it does with istio-iptables).

use std::fmt::Write as _;

use crate::error::{CaptureError, CommandError, CommandFailure};
use crate::generate::CaptureRules;
use crate::iptables_binaries::{IptablesCommands, IptablesToolset};
use crate::rules::{is_own_chain, Family, Rule, RuleSet, Table};
use crate::runner::Runner;
use crate::saved::{SavedState, SavedTable};

/// What [`install`] did for one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// Nothing of ours was there; the rules were written.
    Fresh,
    /// The same rules were already there; nothing was changed.
    Unchanged,
    /// Different rules of ours were there (or `force_apply`); they were replaced.
    Replaced,
}

/// How [`install_with`] treats rules of ours that are already installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstallOptions {
    /// Replace installed rules that differ (`--reconcile`); otherwise that is an error.
    pub reconcile: bool,
    /// Replace installed rules even when they look identical (`--force-apply`).
    pub force_apply: bool,
}

/// Installs the rules with the unsuffixed binaries, replacing different rules of ours.
pub fn install(rules: &CaptureRules, runner: &dyn Runner) -> Result<Vec<Installed>, CaptureError> {
    let options = InstallOptions {
        reconcile: true,
        force_apply: false,
    };
    install_with(rules, &IptablesToolset::unsuffixed(), options, runner)
}

/// Installs the rules, family by family (IPv4 first).
pub fn install_with(
    rules: &CaptureRules,
    tools: &IptablesToolset,
    options: InstallOptions,
    runner: &dyn Runner,
) -> Result<Vec<Installed>, CaptureError> {
    rules
        .families()
        .map(|(family, wanted)| install_family(family, tools.get(family), wanted, options, runner))
        .collect()
}

/// Removes what Remora installed with the unsuffixed binaries.
pub fn cleanup(rules: &CaptureRules, runner: &dyn Runner) -> Result<(), CaptureError> {
    cleanup_with(rules, &IptablesToolset::unsuffixed(), runner)
}

/// Removes what Remora installed, for the families the rules cover.
pub fn cleanup_with(
    rules: &CaptureRules,
    tools: &IptablesToolset,
    runner: &dyn Runner,
) -> Result<(), CaptureError> {
    for (family, wanted) in rules.families() {
        let commands = tools.get(family);
        let saved = read_saved(commands, runner)?;
        let input = removal_input(commands, &saved, wanted, None, runner)?;
        if input.is_empty() {
            tracing::info!(family = family.label(), "nothing to remove");
            continue;
        }
        tracing::info!(
            family = family.label(),
            "removing capture rules:\n{}",
            input.trim_end()
        );
        restore(commands, &input, runner)?;
    }
    Ok(())
}

fn install_family(
    family: Family,
    commands: &IptablesCommands,
    wanted: &RuleSet,
    options: InstallOptions,
    runner: &dyn Runner,
) -> Result<Installed, CaptureError> {
    let name = family.label();
    let saved = read_saved(commands, runner)?;
    if !saved.has_own_chains() {
        let input = wanted.restore_input();
        tracing::info!(
            family = name,
            "installing capture rules:\n{}",
            input.trim_end()
        );
        restore(commands, &input, runner)?;
        return Ok(Installed::Fresh);
    }
    if !options.force_apply && is_installed(commands, wanted, &saved, runner)? {
        tracing::info!(
            family = name,
            "capture rules are already installed; nothing to do"
        );
        return Ok(Installed::Unchanged);
    }
    if !options.reconcile && !options.force_apply {
        return Err(CaptureError::Drift { family: name });
    }
    let input = removal_input(commands, &saved, wanted, Some(wanted), runner)?;
    tracing::info!(
        family = name,
        "replacing capture rules:\n{}",
        input.trim_end()
    );
    restore(commands, &input, runner)?;
    Ok(Installed::Replaced)
}

fn read_saved(
    commands: &IptablesCommands,
    runner: &dyn Runner,
) -> Result<SavedState, CaptureError> {
    let text = runner.run(&commands.save, &[], None)?;
    Ok(SavedState::parse(&text))
}

fn restore(
    commands: &IptablesCommands,
    input: &str,
    runner: &dyn Runner,
) -> Result<(), CommandError> {
    runner
        .run(&commands.restore, &commands.restore_args(), Some(input))
        .map(drop)
}

/// Runs a restore input made of `-C` lines: true if every rule exists.
fn all_present(
    commands: &IptablesCommands,
    input: &str,
    runner: &dyn Runner,
) -> Result<bool, CommandError> {
    match restore(commands, input, runner) {
        Ok(()) => Ok(true),
        Err(CommandError {
            failure: CommandFailure::Exit { stderr, .. },
            ..
        }) => {
            tracing::debug!(stderr, "rule check failed");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Whether the installed chains of ours are exactly `wanted`.
fn is_installed(
    commands: &IptablesCommands,
    wanted: &RuleSet,
    saved: &SavedState,
    runner: &dyn Runner,
) -> Result<bool, CaptureError> {
    for table in Table::ALL {
        let saved_table = saved.table(table);
        let mut have: Vec<&str> = saved_table
            .map(|t| t.own_chains().collect())
            .unwrap_or_default();
        let mut want: Vec<&str> = wanted
            .declared_chains(table)
            .into_iter()
            .filter(|c| is_own_chain(c))
            .collect();
        have.sort_unstable();
        want.sort_unstable();
        if have != want {
            return Ok(false);
        }
        for chain in &want {
            let have = saved_table.map_or(0, |t| t.rules_in(chain).count());
            if have != wanted.in_table(table).filter(|r| r.chain == *chain).count() {
                return Ok(false);
            }
        }
        let have_jumps = saved_table.map_or(0, |t| {
            let jumps = t
                .rules
                .iter()
                .filter(|r| !is_own_chain(&r.chain) && r.targets_own_chain());
            jumps.count()
        });
        let want_jumps = outside_own_chains(wanted, table).filter(|r| r.jumps_to_own_chain());
        if have_jumps != want_jumps.count() {
            return Ok(false);
        }
    }
    // Counts match; let iptables itself compare the rules, since it prints them differently
    // from how we write them (e.g. `--set-mark 1338` comes back as `--set-xmark 0x53a/...`).
    let mut check = String::new();
    for table in wanted.tables() {
        let _ = writeln!(check, "*{}", table.name());
        for rule in wanted.in_table(table) {
            let _ = writeln!(check, "{}", rule.line_as("-C"));
        }
        check.push_str("COMMIT\n");
    }
    Ok(all_present(commands, &check, runner)?)
}

/// Rules that go into chains we do not own (built-in ones).
fn outside_own_chains(wanted: &RuleSet, table: Table) -> impl Iterator<Item = &Rule> {
    wanted.in_table(table).filter(|r| !is_own_chain(r.chain))
}

/// The restore input that removes our rules and chains and, with `replacement`, writes those
/// rules in the same input, table by table. Chains that stay are flushed rather than
/// deleted, so a foreign jump into one does not stop a replacement. Empty if there is nothing
/// to do.
fn removal_input(
    commands: &IptablesCommands,
    saved: &SavedState,
    wanted: &RuleSet,
    replacement: Option<&RuleSet>,
    runner: &dyn Runner,
) -> Result<String, CaptureError> {
    let mut input = String::new();
    for table in Table::ALL {
        let saved_table = saved.table(table);
        let keep: Vec<&str> = replacement.map_or_else(Vec::new, |r| r.declared_chains(table));
        let mut lines = match saved_table {
            Some(t) => removal_lines(commands, t, wanted, &keep, runner)?,
            None => Vec::new(),
        };
        if let Some(replacement) = replacement {
            let existing: Vec<&str> =
                saved_table.map_or_else(Vec::new, |t| t.own_chains().collect());
            for chain in &keep {
                if !existing.contains(chain) {
                    lines.push(format!("-N {chain}"));
                }
            }
            lines.extend(replacement.in_table(table).map(Rule::line));
        }
        if !lines.is_empty() {
            let _ = writeln!(input, "*{}", table.name());
            for line in lines {
                let _ = writeln!(input, "{line}");
            }
            input.push_str("COMMIT\n");
        }
    }
    Ok(input)
}

/// For one table: delete the jumps into our chains and our loose rules in built-in chains,
/// flush our chains, and delete those not in `keep`.
fn removal_lines(
    commands: &IptablesCommands,
    saved_table: &SavedTable,
    wanted: &RuleSet,
    keep: &[&str],
    runner: &dyn Runner,
) -> Result<Vec<String>, CaptureError> {
    let table = saved_table.table;
    let mut lines = Vec::new();
    for rule in &saved_table.rules {
        if is_own_chain(&rule.chain) || !rule.targets_own_chain() {
            continue;
        }
        if !saved_table.is_built_in(&rule.chain) {
            let target = rule.target.clone().unwrap_or_default();
            if keep.contains(&target.as_str()) {
                continue;
            }
            return Err(CaptureError::ForeignReference {
                table: table.name().to_owned(),
                chain: rule.chain.clone(),
                target,
            });
        }
        lines.push(rule.delete_line());
    }
    // Our rules in built-in chains that jump nowhere of ours can only be recognised by
    // content, which iptables prints in its own form; so ask iptables, rule by rule.
    let mut loose: Vec<String> = Vec::new();
    for rule in outside_own_chains(wanted, table).filter(|r| !r.jumps_to_own_chain()) {
        let delete = rule.line_as("-D");
        if loose.contains(&delete) {
            continue;
        }
        let check = format!("*{}\n{}\nCOMMIT\n", table.name(), rule.line_as("-C"));
        if all_present(commands, &check, runner)? {
            loose.push(delete);
        }
    }
    lines.extend(loose);
    let own: Vec<&str> = saved_table.own_chains().collect();
    lines.extend(own.iter().map(|chain| format!("-F {chain}")));
    let dropped = own.iter().filter(|chain| !keep.contains(chain));
    lines.extend(dropped.map(|chain| format!("-X {chain}")));
    Ok(lines)
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
