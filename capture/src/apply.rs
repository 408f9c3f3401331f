//! Installing and removing the rules: the thin layer between the generator and iptables.
//!
//! Per IP family, IPv4 first:
//! - **install** reads the installed state with `iptables-save`. Without any `ISTIO_*` chain
//!   it writes the rules with one `iptables-restore --noflush`, whose input is exactly what
//!   `--dry-run` prints. If our chains exist and hold exactly the wanted rules (same chains,
//!   same rule counts, and every rule confirmed by iptables' own `-C` matching), it does
//!   nothing; otherwise it removes them first, then writes.
//! - **cleanup** removes what we own: every `ISTIO_*` chain, the jumps into them from built-in
//!   chains, and the rules the current flags put straight into built-in chains (the RETURNs
//!   for `-c`/`-k` and the TPROXY marks), found with `-C`. Everything else is left alone; a
//!   user chain that jumps into ours is an error rather than something we silently edit.
//!
//! Removal is one `iptables-restore --noflush` per family too, so it either fully happens or
//! not at all.

use std::fmt::Write as _;

use crate::error::{CaptureError, CommandError, CommandFailure};
use crate::generate::CaptureRules;
use crate::rules::{is_own_chain, Family, Rule, RuleSet, Table};
use crate::runner::Runner;
use crate::saved::SavedState;

/// What [`install`] did for one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// Nothing of ours was there; the rules were written.
    Fresh,
    /// The same rules were already there; nothing was changed.
    Unchanged,
    /// Different rules of ours were there; they were removed and the rules written.
    Replaced,
}

/// Installs the rules, family by family (IPv4 first).
pub fn install(rules: &CaptureRules, runner: &dyn Runner) -> Result<Vec<Installed>, CaptureError> {
    rules
        .families()
        .map(|(family, wanted)| install_family(family, wanted, runner))
        .collect()
}

/// Removes what Remora installed, for the families the rules cover.
pub fn cleanup(rules: &CaptureRules, runner: &dyn Runner) -> Result<(), CaptureError> {
    for (family, wanted) in rules.families() {
        let saved = read_saved(family, runner)?;
        if !remove(family, &saved, wanted, runner)? {
            tracing::info!(family = family.label(), "nothing to remove");
        }
    }
    Ok(())
}

fn install_family(
    family: Family,
    wanted: &RuleSet,
    runner: &dyn Runner,
) -> Result<Installed, CaptureError> {
    let name = family.label();
    let saved = read_saved(family, runner)?;
    let outcome = if !saved.has_own_chains() {
        Installed::Fresh
    } else if is_installed(family, wanted, &saved, runner)? {
        tracing::info!(
            family = name,
            "capture rules are already installed; nothing to do"
        );
        return Ok(Installed::Unchanged);
    } else {
        tracing::info!(
            family = name,
            "replacing previously installed capture rules"
        );
        remove(family, &saved, wanted, runner)?;
        Installed::Replaced
    };
    let input = wanted.restore_input();
    tracing::info!(
        family = name,
        "installing capture rules:\n{}",
        input.trim_end()
    );
    restore(family, &input, runner)?;
    Ok(outcome)
}

fn read_saved(family: Family, runner: &dyn Runner) -> Result<SavedState, CaptureError> {
    let text = runner.run(family.save_command(), &[], None)?;
    Ok(SavedState::parse(&text))
}

fn restore(family: Family, input: &str, runner: &dyn Runner) -> Result<(), CommandError> {
    runner
        .run(family.restore_command(), &["--noflush"], Some(input))
        .map(drop)
}

/// Runs a restore input made of `-C` lines: true if every rule exists.
fn all_present(family: Family, input: &str, runner: &dyn Runner) -> Result<bool, CommandError> {
    match restore(family, input, runner) {
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
    family: Family,
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
    Ok(all_present(family, &check, runner)?)
}

/// Rules that go into chains we do not own (built-in ones).
fn outside_own_chains(wanted: &RuleSet, table: Table) -> impl Iterator<Item = &Rule> {
    wanted.in_table(table).filter(|r| !is_own_chain(r.chain))
}

/// Removes our chains and the rules leading into them; returns whether anything was removed.
fn remove(
    family: Family,
    saved: &SavedState,
    wanted: &RuleSet,
    runner: &dyn Runner,
) -> Result<bool, CaptureError> {
    let mut input = String::new();
    for saved_table in saved.tables() {
        let table = saved_table.table;
        let mut lines = Vec::new();
        for rule in &saved_table.rules {
            if is_own_chain(&rule.chain) || !rule.targets_own_chain() {
                continue;
            }
            if !saved_table.is_built_in(&rule.chain) {
                return Err(CaptureError::ForeignReference {
                    table: table.name().to_owned(),
                    chain: rule.chain.clone(),
                    target: rule.target.clone().unwrap_or_default(),
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
            if all_present(family, &check, runner)? {
                loose.push(delete);
            }
        }
        lines.extend(loose);
        let own: Vec<&str> = saved_table.own_chains().collect();
        lines.extend(own.iter().map(|chain| format!("-F {chain}")));
        lines.extend(own.iter().map(|chain| format!("-X {chain}")));
        if !lines.is_empty() {
            let _ = writeln!(input, "*{}", table.name());
            for line in lines {
                let _ = writeln!(input, "{line}");
            }
            input.push_str("COMMIT\n");
        }
    }
    if input.is_empty() {
        return Ok(false);
    }
    let name = family.label();
    tracing::info!(
        family = name,
        "removing capture rules:\n{}",
        input.trim_end()
    );
    restore(family, &input, runner)?;
    Ok(true)
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
