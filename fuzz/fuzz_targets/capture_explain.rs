//! The rule text `remora capture explain` reads (`iptables-save` or `nft list ruleset`
//! output, from the machine or a file): any text parses to a ruleset that a connection can be
//! traced through and compared, never a panic or an endless walk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora_capture::explain::model::{Family, Proto};
use remora_capture::explain::trace::{trace, Connection, Direction};
use remora_capture::explain::{check, parse_rules};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let family = if flags & 1 == 0 {
        Family::V4
    } else {
        Family::V6
    };
    let rules = parse_rules(text, family);
    let direction = if flags & 2 == 0 {
        Direction::Outbound
    } else {
        Direction::Inbound
    };
    let v6 = family == Family::V6;
    let conn = Connection {
        direction,
        proto: if flags & 4 == 0 {
            Proto::Tcp
        } else {
            Proto::Udp
        },
        src: Some(if v6 {
            [0xfd00, 0, 0, 0, 0, 0, 0, 2].into()
        } else {
            [10, 0, 0, 2].into()
        }),
        dst: Some(if v6 {
            [0xfd00, 0, 0, 0, 0, 0, 0, 1].into()
        } else {
            [10, 0, 0, 1].into()
        }),
        sport: Some(40000),
        dport: Some(if flags & 8 == 0 { 80 } else { 53 }),
        uid: Some(if flags & 16 == 0 { 1000 } else { 1337 }),
        gid: Some(1337),
        in_iface: (direction == Direction::Inbound).then(|| "eth0".to_string()),
        out_iface: Some("eth0".to_string()),
        mark: u32::from(flags >> 5),
    };
    let t = trace(&rules, &conn);
    let _ = (t.to_string(), t.matched_rules());
    let diffs = check::compare(&rules, &rules);
    assert!(
        !diffs.iter().any(|d| d.differs()),
        "a ruleset differs from itself"
    );
    let _ = check::render(&diffs);
});
