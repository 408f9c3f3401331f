use super::*;
use crate::dns::message::tests::query;

fn q_of(query: &[u8]) -> Question {
    question(query).expect("a plain question")
}

#[test]
fn the_question_is_read_lowercase_with_its_type() {
    let mut q = query(7, "Reviews.Client");
    let parsed = q_of(&q);
    assert_eq!(parsed.name, "reviews.client.");
    assert_eq!(parsed.family(), Some(Family::A));
    assert_eq!(parsed.end, q.len());
    // AAAA.
    let n = q.len();
    q[n - 3] = 28;
    assert_eq!(q_of(&q).family(), Some(Family::Aaaa));
    q[n - 3] = 15; // MX
    assert_eq!(q_of(&q).family(), None);
    // Not a plain name, not one question, not a query: nothing to answer locally.
    assert!(question(&query(1, "we\u{1}ird.example")).is_none());
    let mut two = query(1, "a.b");
    two[5] = 2;
    assert!(question(&two).is_none());
    let mut notify = query(1, "a.b");
    notify[2] |= 4 << 3;
    assert!(question(&notify).is_none());
    assert!(question(&query(1, "a.b")[..14]).is_none());
}

#[test]
fn an_answer_echoes_the_query_points_at_the_question_and_carries_ttl_30() {
    let mut q = query(0xABCD, "Db.client");
    q[3] = CD; // checking disabled, copied back
    let parsed = q_of(&q);
    let records = [Record::A {
        owner: "db.client.".into(),
        ip: "240.240.0.1".parse().unwrap(),
    }];
    let r = response(&q, &parsed, &records, UDP_MIN);
    assert_eq!(&r[..2], &[0xAB, 0xCD]);
    assert_eq!(r[2], QR | AA | RD, "response, authoritative, RD copied");
    assert_eq!(r[3], CD, "RA clear, NOERROR, CD copied");
    assert_eq!(&r[4..12], &[0, 1, 0, 1, 0, 0, 0, 0]);
    assert_eq!(
        &r[HEADER_LEN..parsed.end],
        &q[HEADER_LEN..],
        "question as asked"
    );
    let rr = &r[parsed.end..];
    assert_eq!(
        rr,
        &[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 240, 240, 0, 1][..]
    );
}

#[test]
fn a_cname_chain_spells_the_target_and_no_data_has_no_records() {
    let q = query(1, "api.example.com.ns.svc.cluster.local");
    let parsed = q_of(&q);
    let records = [
        Record::Cname {
            owner: parsed.name.clone(),
            target: "api.example.com.".into(),
        },
        Record::Aaaa {
            owner: "api.example.com.".into(),
            ip: "fd00::1".parse().unwrap(),
        },
    ];
    let r = response(&q, &parsed, &records, UDP_MIN);
    assert_eq!(&r[6..8], &[0, 2]);
    let mut at = parsed.end;
    assert_eq!(&r[at..at + 12], &[0xC0, 12, 0, 5, 0, 1, 0, 0, 0, 30, 0, 17]);
    at += 12;
    assert_eq!(&r[at..at + 17], b"\x03api\x07example\x03com\x00");
    at += 17;
    assert_eq!(&r[at..at + 17], b"\x03api\x07example\x03com\x00");
    at += 17;
    assert_eq!(&r[at..at + 10], &[0, 28, 0, 1, 0, 0, 0, 30, 0, 16]);
    assert_eq!(r.len(), at + 10 + 16);
    let empty = response(&q, &parsed, &[], UDP_MIN);
    assert_eq!(&empty[6..8], &[0, 0]);
    assert_eq!(empty.len(), parsed.end);
    assert_eq!(empty[3] & 0x0F, 0, "NOERROR, not NXDOMAIN");
}

#[test]
fn udp_answers_fit_the_clients_buffer_with_tc_when_cut() {
    let q = query(2, "headless.ns.svc.cluster.local");
    let parsed = q_of(&q);
    let records: Vec<Record> = (0..100u8)
        .map(|i| Record::A {
            owner: parsed.name.clone(),
            ip: [10, 0, 0, i].into(),
        })
        .collect();
    let cut = response(&q, &parsed, &records, udp_limit(&q, &parsed));
    assert!(cut.len() <= UDP_MIN);
    assert_eq!(cut[2] & TC, TC);
    let kept = u16::from_be_bytes([cut[6], cut[7]]);
    assert_eq!(usize::from(kept), (UDP_MIN - parsed.end) / 16);
    let whole = response(&q, &parsed, &records, TCP_MAX);
    assert_eq!(whole[2] & TC, 0);
    assert_eq!(&whole[6..8], &[0, 100]);
    // An EDNS query (OPT with a 4096-byte payload) takes them all over UDP.
    let mut edns = q.clone();
    edns[11] = 1;
    edns.extend_from_slice(&[0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0]);
    let parsed = q_of(&edns);
    assert_eq!(udp_limit(&edns, &parsed), 4096);
    let r = response(&edns, &parsed, &records, udp_limit(&edns, &parsed));
    assert_eq!(&r[6..8], &[0, 100]);
    assert_eq!(r[2] & TC, 0);
    // The OPT record is not echoed: the answer's question ends where the query's did.
    assert_eq!(&r[10..12], &[0, 0]);
}
