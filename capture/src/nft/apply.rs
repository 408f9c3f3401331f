//! Installing and removing the native nftables rules, each in one `nft -f -` transaction.
//!
//! The program [`NftProgram::script`] renders creates and flushes each table it fills, so
//! loading it replaces an earlier installation atomically; tables of ours that the new rules
//! no longer use are deleted in the same transaction. Istio's nftables backend always
//! rewrites its tables like this, without a drift check, and so `--reconcile` changes nothing
//! here; what Remora adds is leaving identical rules alone (unless `--force-apply`), judged
//! by comparing the installed listing with the program rule by rule after normalising both
//! ([`crate::explain::nft`] parses either form).

use std::fmt::Write as _;

use crate::apply::{InstallOptions, Installed};
use crate::error::{CaptureError, CommandFailure};
use crate::nft::program::{cleanup_script, NftProgram, NftTable};
use crate::runner::Runner;

/// The nft binary.
pub const NFT: &str = "nft";

/// Installs the program (see the module documentation).
pub fn install(
    program: &NftProgram,
    options: InstallOptions,
    runner: &dyn Runner,
) -> Result<Installed, CaptureError> {
    let installed = installed_tables(runner)?;
    let outcome = if installed.is_empty() {
        Installed::Fresh
    } else if !options.force_apply && is_installed(program, &installed, runner)? {
        tracing::info!("nftables capture rules are already installed; nothing to do");
        return Ok(Installed::Unchanged);
    } else {
        Installed::Replaced
    };
    let mut script = String::new();
    let wanted = program.tables();
    for table in installed.iter().filter(|t| !wanted.contains(t)) {
        let _ = writeln!(script, "delete table inet {}", table.name());
    }
    script.push_str(&program.script());
    if script.is_empty() {
        return Ok(outcome);
    }
    tracing::info!("loading nftables capture rules:\n{}", script.trim_end());
    load(&script, runner)?;
    Ok(outcome)
}

/// Removes every table of ours, in one transaction.
pub fn cleanup(runner: &dyn Runner) -> Result<(), CaptureError> {
    if installed_tables(runner)?.is_empty() {
        tracing::info!("no nftables capture rules to remove");
        return Ok(());
    }
    let script = cleanup_script();
    tracing::info!("removing nftables capture rules:\n{}", script.trim_end());
    load(&script, runner)
}

/// Our tables that exist, in program order.
pub fn installed_tables(runner: &dyn Runner) -> Result<Vec<NftTable>, CaptureError> {
    let listing = run_nft(runner, &["list", "tables", "inet"], None)?;
    let mut tables: Vec<NftTable> = listing
        .lines()
        .filter_map(|line| line.trim().strip_prefix("table inet "))
        .filter_map(|name| NftTable::from_name(name.trim()))
        .collect();
    tables.sort();
    Ok(tables)
}

/// The installed rules of our tables, as `nft list table` prints them.
pub fn listing(tables: &[NftTable], runner: &dyn Runner) -> Result<String, CaptureError> {
    let mut text = String::new();
    for table in tables {
        text.push_str(&run_nft(
            runner,
            &["list", "table", "inet", table.name()],
            None,
        )?);
    }
    Ok(text)
}

fn is_installed(
    program: &NftProgram,
    installed: &[NftTable],
    runner: &dyn Runner,
) -> Result<bool, CaptureError> {
    if installed != program.tables() {
        return Ok(false);
    }
    let text = listing(installed, runner)?;
    Ok(crate::explain::nft::same_rules(&program.script(), &text))
}

fn load(script: &str, runner: &dyn Runner) -> Result<(), CaptureError> {
    run_nft(runner, &["-f", "-"], Some(script)).map(drop)
}

fn run_nft(
    runner: &dyn Runner,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, CaptureError> {
    runner.run(NFT, args, stdin).map_err(|e| match e.failure {
        CommandFailure::Spawn(source) => CaptureError::NftMissing(source),
        _ => e.into(),
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::error::CommandError;

    /// Answers `nft list` with canned text and records every `nft -f` input.
    struct Fake {
        tables: &'static str,
        listing: String,
        loaded: RefCell<Vec<String>>,
    }

    impl Runner for Fake {
        fn run(
            &self,
            program: &str,
            args: &[&str],
            stdin: Option<&str>,
        ) -> Result<String, CommandError> {
            assert_eq!(program, "nft");
            match args {
                ["list", "tables", "inet"] => Ok(self.tables.to_owned()),
                ["list", "table", "inet", _] => Ok(self.listing.clone()),
                ["-f", "-"] => {
                    self.loaded
                        .borrow_mut()
                        .push(stdin.unwrap_or("").to_owned());
                    Ok(String::new())
                }
                other => panic!("unexpected nft {other:?}"),
            }
        }
    }

    fn program(argv: &[&str]) -> NftProgram {
        crate::nft::generate_nft(&crate::test_support::config(argv))
    }

    const OPTIONS: InstallOptions = InstallOptions {
        reconcile: false,
        force_apply: false,
    };

    #[test]
    fn fresh_install_loads_exactly_the_dry_run_program() {
        let p = program(&["-b", "*", "-i", "*"]);
        let fake = Fake {
            tables: "table inet other\n",
            listing: String::new(),
            loaded: RefCell::default(),
        };
        assert_eq!(install(&p, OPTIONS, &fake).unwrap(), Installed::Fresh);
        assert_eq!(*fake.loaded.borrow(), [p.script()]);
    }

    #[test]
    fn identical_rules_are_left_alone_unless_forced() {
        let p = program(crate::explain::nft::tests::FLAGS);
        // What the kernel lists after loading that program.
        let listing = crate::explain::nft::tests::LISTING.to_owned();
        let fake = Fake {
            tables: "table inet istio-proxy-nat\n",
            listing,
            loaded: RefCell::default(),
        };
        assert_eq!(install(&p, OPTIONS, &fake).unwrap(), Installed::Unchanged);
        assert!(fake.loaded.borrow().is_empty());
        let forced = InstallOptions {
            force_apply: true,
            ..OPTIONS
        };
        assert_eq!(install(&p, forced, &fake).unwrap(), Installed::Replaced);
        assert_eq!(fake.loaded.borrow().len(), 1);
    }

    #[test]
    fn different_rules_are_replaced_in_one_transaction_dropping_unused_tables() {
        let p = program(&["-b", "*", "-i", "*"]);
        let fake = Fake {
            tables: "table inet istio-proxy-nat\ntable inet istio-proxy-mangle\n",
            listing: "table inet istio-proxy-nat {\n}\n".to_owned(),
            loaded: RefCell::default(),
        };
        assert_eq!(install(&p, OPTIONS, &fake).unwrap(), Installed::Replaced);
        let loaded = fake.loaded.borrow();
        assert_eq!(loaded.len(), 1);
        assert!(loaded[0].starts_with("delete table inet istio-proxy-mangle\nadd table inet istio-proxy-nat\nflush table inet istio-proxy-nat\n"), "{}", loaded[0]);
    }

    #[test]
    fn cleanup_deletes_every_table_at_once_and_only_if_any() {
        let fake = Fake {
            tables: "table inet istio-proxy-raw\n",
            listing: String::new(),
            loaded: RefCell::default(),
        };
        cleanup(&fake).unwrap();
        assert_eq!(*fake.loaded.borrow(), [cleanup_script()]);
        let fake = Fake {
            tables: "",
            listing: String::new(),
            loaded: RefCell::default(),
        };
        cleanup(&fake).unwrap();
        assert!(fake.loaded.borrow().is_empty());
    }
}
