//! The nft parser against programs Remora writes and listings the kernel printed for them
//! (captured from `nft list table` after loading the program, nftables 1.0.6).

use super::*;

/// Flags whose program [`LISTING`] is the kernel's listing of.
pub(crate) const FLAGS: &[&str] = &["-b", "*"];

/// `nft list table inet istio-proxy-nat` after loading the program for [`FLAGS`].
pub(crate) const LISTING: &str = r#"table inet istio-proxy-nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		meta l4proto tcp counter packets 0 bytes 0 jump istio-inbound
	}

	chain output {
		type nat hook output priority -100; policy accept;
		counter packets 0 bytes 0 jump istio-output
	}

	chain istio-inbound {
		tcp dport 15008 counter packets 0 bytes 0 return
		meta l4proto tcp counter packets 0 bytes 0 jump istio-in-redirect
	}

	chain istio-redirect {
		meta l4proto tcp counter packets 0 bytes 0 redirect to :15001
	}

	chain istio-in-redirect {
		meta l4proto tcp counter packets 0 bytes 0 redirect to :15006
	}

	chain istio-output {
		oifname "lo" ip saddr 127.0.0.6 counter packets 0 bytes 0 return
		oifname "lo" ip daddr != 127.0.0.1 tcp dport != 15008 meta skuid 1337 counter packets 3 bytes 180 jump istio-in-redirect
		oifname "lo" meta skuid != 1337 counter packets 0 bytes 0 return
		meta skuid 1337 counter packets 0 bytes 0 return
		oifname "lo" ip daddr != 127.0.0.1 tcp dport != 15008 meta skgid 1337 counter packets 0 bytes 0 jump istio-in-redirect
		oifname "lo" meta skgid != 1337 counter packets 0 bytes 0 return
		meta skgid 1337 counter packets 0 bytes 0 return
		ip daddr 127.0.0.1 counter packets 0 bytes 0 return
	}
}
"#;

fn program() -> String {
    crate::nft::generate_nft(&crate::test_support::config(FLAGS)).script()
}

#[test]
fn a_program_and_the_kernels_listing_of_it_are_the_same_rules() {
    assert!(same_rules(&program(), LISTING));
    let changed = LISTING.replace("tcp dport 15008 counter", "tcp dport 15009 counter");
    assert!(!same_rules(&program(), &changed));
    let dropped = LISTING.replace(
        "\t\tip daddr 127.0.0.1 counter packets 0 bytes 0 return\n",
        "",
    );
    assert!(!same_rules(&program(), &dropped));
    let other = crate::nft::generate_nft(&crate::test_support::config(&["-b", "*", "-i", "*"]));
    assert!(!same_rules(&other.script(), LISTING));
}

#[test]
fn listings_carry_hooks_priorities_and_counters() {
    let set = parse(LISTING);
    let table = &set.tables[0];
    assert_eq!(
        (table.name.as_str(), table.family),
        ("istio-proxy-nat", None)
    );
    let pre = table.chain("prerouting").unwrap();
    assert_eq!(pre.hook, Some((Hook::Prerouting, -100)));
    let out = table.chain("istio-output").unwrap();
    assert_eq!(out.rules[1].packets, Some(3));
    assert_eq!(
        out.rules[1].actions,
        [Action::Counter, Action::Jump("istio-in-redirect".into())]
    );
    let m = &out.rules[1].matches;
    assert_eq!(
        m[0],
        Match {
            negated: false,
            test: Test::OutInterface("lo".into())
        }
    );
    assert_eq!(m[1].test, Test::Family(Family::V4));
    assert!(m[2].negated && m[2].test == Test::Destination(Cidr::parse("127.0.0.1/32").unwrap()));
    assert!(
        m[3].negated && m[3].test == Test::DestinationPort(Proto::Tcp, Ports(vec![(15008, 15008)]))
    );
    assert_eq!(m[4].test, Test::Uid("1337".into()));
}

#[test]
fn program_inserts_land_where_nft_puts_them() {
    let text = "add table inet t\n\
        add chain inet t prerouting { type nat hook prerouting priority -100 ; }\n\
        add rule inet t prerouting iifname eth1 counter return\n\
        insert rule inet t prerouting index 0 iifname eth2 counter return\n\
        insert rule inet t prerouting index 0 iifname eth1 ip daddr 10.0.0.0/8 counter jump r\n";
    let set = parse(text);
    let rules = &set.tables[0].chains[0].rules;
    let texts: Vec<&str> = rules.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "iifname eth1 ip daddr 10.0.0.0/8 counter jump r",
            "iifname eth2 counter return",
            "iifname eth1 counter return"
        ]
    );
}

#[test]
fn marks_tproxy_and_zones() {
    let r = parse_rule("meta l4proto tcp ip6 daddr != ::1/128 tproxy ip6 to :15006 meta mark set 1337 counter accept");
    assert_eq!(
        r.actions,
        [
            Action::Tproxy {
                port: 15006,
                mark: None
            },
            Action::SetMark(Mark {
                value: 1337,
                mask: u32::MAX
            }),
            Action::Counter,
            Action::Accept
        ]
    );
    let listed = parse_rule("meta l4proto tcp meta mark 0x00000539 counter ct mark set meta mark");
    let written = parse_rule("meta l4proto tcp mark 1337 counter ct mark set mark");
    assert_eq!(listed.canonical(), written.canonical());
    assert_eq!(
        parse_rule("meta l4proto tcp ct mark 1337 counter meta mark set ct mark").actions[1],
        Action::RestoreMark
    );
    assert_eq!(
        parse_rule("udp dport 53 meta skuid 1337 counter ct zone set 1").actions[1],
        Action::CtZone(1)
    );
    let states = parse_rule("ct state related,established counter");
    let listed = parse_rule("ct state established,related counter");
    assert_eq!(states.canonical(), listed.canonical());
    let unknown = parse_rule("fib daddr type local counter accept");
    assert!(matches!(unknown.matches[0].test, Test::Unknown(_)));
    assert!(looks_like_nft(LISTING) && looks_like_nft(&program()));
    assert!(!looks_like_nft("*nat\n-A OUTPUT -j X\nCOMMIT\n"));
}
