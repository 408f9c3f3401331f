//! Parsing of `remora capture` flags (see [`super`]).

use clap::Parser;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: CaptureArgs,
}

fn parse(argv: &[&str]) -> CaptureArgs {
    let argv = std::iter::once("capture").chain(argv.iter().copied());
    Cli::try_parse_from(argv).expect("flags parse").args
}

#[test]
fn short_and_long_forms_set_the_same_field() {
    let short = parse(&[
        "-p",
        "1",
        "-z",
        "2",
        "-b",
        "*",
        "-i",
        "10.0.0.0/8",
        "-c",
        "eth9",
    ]);
    let long = parse(&[
        "--envoy-port=1",
        "--inbound-capture-port",
        "2",
        "--istio-inbound-ports=*",
        "--istio-service-cidr",
        "10.0.0.0/8",
        "--istio-exclude-interfaces=eth9",
    ]);
    for args in [short, long] {
        assert_eq!(args.envoy_port.as_deref(), Some("1"));
        assert_eq!(args.inbound_capture_port.as_deref(), Some("2"));
        assert_eq!(args.inbound_ports.as_deref(), Some("*"));
        assert_eq!(args.outbound_cidrs.as_deref(), Some("10.0.0.0/8"));
        assert_eq!(args.exclude_interfaces.as_deref(), Some("eth9"));
    }
}

#[test]
fn empty_values_are_kept_apart_from_absent_ones() {
    let args = parse(&["-b", "", "-x", "", "-u", ""]);
    assert_eq!(args.inbound_ports.as_deref(), Some(""));
    assert_eq!(args.outbound_exclude_cidrs.as_deref(), Some(""));
    assert_eq!(args.proxy_uid.as_deref(), Some(""));
    assert_eq!(args.outbound_cidrs, None);
    assert_eq!(parse(&["--dns-servers="]).dns_servers.as_deref(), Some(""));
}

#[test]
fn comma_lists_and_wildcards_pass_through_verbatim() {
    let args = parse(&["-u", "3,4", "-g", "1,2", "-d", "6000,7000,", "-i", "*"]);
    assert_eq!(args.proxy_uid.as_deref(), Some("3,4"));
    assert_eq!(args.proxy_gid.as_deref(), Some("1,2"));
    assert_eq!(args.inbound_exclude_ports.as_deref(), Some("6000,7000,"));
    assert_eq!(args.outbound_cidrs.as_deref(), Some("*"));
}

#[test]
fn repeated_flags_keep_the_last_value() {
    let args = parse(&[
        "-p",
        "1",
        "-p",
        "2",
        "--redirect-dns",
        "--redirect-dns=false",
    ]);
    assert_eq!(args.envoy_port.as_deref(), Some("2"));
    assert_eq!(args.redirect_dns, Some(false));
}

#[test]
fn booleans_take_an_optional_go_style_value() {
    let args = parse(&[
        "--redirect-dns",
        "--capture-all-dns=0",
        "-n",
        "--drop-invalid=T",
    ]);
    assert_eq!(args.redirect_dns, Some(true));
    assert_eq!(args.capture_all_dns, Some(false));
    assert_eq!(args.dry_run, Some(true));
    assert_eq!(args.drop_invalid, Some(true));
    assert_eq!(args.dual_stack, None);
    let argv = ["capture", "--redirect-dns=yes"];
    assert!(Cli::try_parse_from(argv).is_err());
}

#[test]
fn unknown_flags_are_rejected() {
    assert!(Cli::try_parse_from(["capture", "--no-such-flag"]).is_err());
}

#[test]
fn boolean_flags_fall_back_to_their_variables() {
    let env = Environment::from_pairs([
        ("REDIRECT_DNS", "false"),
        ("ISTIO_META_DNS_CAPTURE", "true"),
    ]);
    let vars = [var::REDIRECT_DNS, var::META_DNS_CAPTURE];
    assert!(flag_or_env(None, &env, &vars));
    assert!(!flag_or_env(Some(false), &env, &vars));
    let junk =
        Environment::from_pairs([("REDIRECT_DNS", "true"), ("ISTIO_META_DNS_CAPTURE", "on")]);
    assert!(
        flag_or_env(None, &junk, &vars),
        "an invalid value is ignored"
    );
    assert!(!flag_or_env(None, &Environment::default(), &vars));
}

#[test]
fn action_prefers_dry_run() {
    let env = Environment::default();
    assert_eq!(parse(&[]).action(&env), Action::Apply);
    assert_eq!(parse(&["--cleanup-only"]).action(&env), Action::CleanupOnly);
    let dry_cleanup = Action::DryRun { cleanup_only: true };
    assert_eq!(parse(&["--cleanup-only", "-n"]).action(&env), dry_cleanup);
    let env = Environment::from_pairs([("DRY_RUN", "1")]);
    assert_eq!(
        parse(&[]).action(&env),
        Action::DryRun {
            cleanup_only: false
        }
    );
}

#[test]
fn log_level_reads_the_default_scope() {
    let level = |spec: &str| {
        let args = parse(&["--log_output_level", spec]);
        args.log_level().map(str::to_owned)
    };
    assert_eq!(level("default:info").as_deref(), Some("info"));
    assert_eq!(level("debug").as_deref(), Some("debug"));
    assert_eq!(level("ads:debug,default:warn").as_deref(), Some("warn"));
    assert_eq!(level("ads:debug").as_deref(), None);
    assert_eq!(level("default:fatal").as_deref(), Some("error"));
    assert_eq!(level("none").as_deref(), Some("off"));
    assert_eq!(parse(&[]).log_level(), None);
    assert!(parse(&["--log_as_json"]).log_as_json());
    assert!(!parse(&[]).log_as_json());
}
