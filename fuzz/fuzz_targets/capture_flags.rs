//! `remora capture`'s flags and environment (what a pod spec or an operator writes): any
//! command line resolves to rules or to a flag error, never a panic. Rules generated are read
//! back by `explain`'s parsers, which must find them identical to themselves and trace a
//! connection through them.
#![no_main]

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use remora_capture::explain::model::{Family, Proto};
use remora_capture::explain::trace::{trace, Connection, Direction};
use remora_capture::explain::{check, iptables, nft};
use remora_capture::{
    generate, Backend, CaptureArgs, CaptureConfig, CaptureError, Environment, PodNetwork,
    RunOptions,
};

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: CaptureArgs,
}

/// The pod's facts, fixed (the machine's are never read).
struct Pod {
    ipv6: bool,
}

impl PodNetwork for Pod {
    fn is_ipv6(&self, _dual_stack: bool) -> Result<bool, CaptureError> {
        Ok(self.ipv6)
    }
    fn nameservers(&self) -> Result<Vec<String>, CaptureError> {
        Ok(vec!["10.96.0.10".to_string(), "fd00::a".to_string()])
    }
}

fuzz_target!(|data: &[u8]| {
    // Before the first 0xff: the command line; after it: NAME=value environment entries.
    let (argv, env) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let ipv6 = argv.first().is_some_and(|b| b & 1 == 1);
    let argv = std::iter::once("capture".to_string()).chain(remora_fuzz::words(argv));
    let Ok(cli) = Cli::try_parse_from(argv) else {
        return;
    };
    let env = Environment::from_pairs(remora_fuzz::words(env).into_iter().filter_map(|w| {
        let (k, v) = w.split_once('=')?;
        Some((k.to_string(), v.to_string()))
    }));
    let _ = (
        cli.args.log_level(),
        cli.args.log_as_json(),
        cli.args.action(&env),
    );
    let Ok(options) = RunOptions::resolve(&cli.args, &env) else {
        return;
    };
    let Ok(config) = CaptureConfig::resolve(&cli.args, &env, &Pod { ipv6 }) else {
        return;
    };
    let _ = remora_capture::dry_run_output(&config, &options);
    let conn = Connection {
        direction: Direction::Outbound,
        proto: Proto::Tcp,
        src: None,
        dst: Some([10, 0, 0, 1].into()),
        sport: None,
        dport: Some(80),
        uid: Some(1000),
        gid: None,
        in_iface: None,
        out_iface: None,
        mark: 0,
    };
    if options.backend == Backend::Nftables {
        let script = remora_capture::nft::generate_nft(&config).script();
        let wanted = nft::parse(&script);
        let diffs = check::compare(&wanted, &wanted);
        assert!(!diffs.iter().any(|d| d.differs()), "{script}");
        let _ = trace(&wanted, &conn).to_string();
    } else {
        for (family, set) in generate(&config).families() {
            let family = match family {
                remora_capture::rules::Family::V4 => Family::V4,
                remora_capture::rules::Family::V6 => Family::V6,
            };
            let text = set.restore_input();
            let wanted = iptables::parse(&text, family);
            let diffs = check::compare(&wanted, &wanted);
            assert!(!diffs.iter().any(|d| d.differs()), "{text}");
            if family == Family::V4 {
                let _ = trace(&wanted, &conn).to_string();
            }
        }
    }
});
