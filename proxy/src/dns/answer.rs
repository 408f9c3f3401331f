//! Local answers: reading the question of a query and writing the response from the name
//! table's records (RFC 1035 §4.1), as pilot-agent's DNS library writes its replies: the ID,
//! opcode, RD and CD bits and the question echoed, AA set (we are the authority for these
//! names), RA clear, no EDNS record, and on UDP only as many records as fit the client's
//! buffer (512 bytes, or its EDNS size), with TC set when some were left out.

use super::message::HEADER_LEN;
use super::table::{Family, Record, TTL};

const QR: u8 = 0x80;
const AA: u8 = 0x04;
const TC: u8 = 0x02;
const RD: u8 = 0x01;
const OPCODE: u8 = 0x78;
const CD: u8 = 0x10;

const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const TYPE_AAAA: u16 = 28;
const TYPE_OPT: u16 = 41;
const CLASS_IN: u16 = 1;

/// A UDP answer's limit without EDNS (RFC 1035 §4.2.1).
pub const UDP_MIN: usize = 512;
/// A TCP answer's limit: its length prefix has two bytes.
pub const TCP_MAX: usize = 65_535;

/// The one question of a standard query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Lowercase, with the trailing dot (`.` for the root).
    pub name: String,
    pub qtype: u16,
    /// The offset just past the question.
    pub end: usize,
}

impl Question {
    /// The address family asked for, if A or AAAA.
    pub fn family(&self) -> Option<Family> {
        match self.qtype {
            TYPE_A => Some(Family::A),
            TYPE_AAAA => Some(Family::Aaaa),
            _ => None,
        }
    }
}

/// The question of `query`, if it is a standard query (opcode QUERY) with exactly one question
/// whose name is plain: labels of letters, digits, `-`, `_` and `*`, no compression. Anything
/// else is no name of the mesh's and goes upstream untouched.
pub fn question(query: &[u8]) -> Option<Question> {
    if query.len() < HEADER_LEN || query[2] & QR != 0 || query[2] & OPCODE != 0 {
        return None;
    }
    if query.get(4..6)? != [0, 1] {
        return None;
    }
    let mut at = HEADER_LEN;
    let mut name = String::new();
    loop {
        let len = usize::from(*query.get(at)?);
        if len == 0 {
            at += 1;
            break;
        }
        if len > 63 || name.len() + len + 1 > 255 {
            return None;
        }
        let label = query.get(at + 1..at + 1 + len)?;
        if !label
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'*'))
        {
            return None;
        }
        name.extend(label.iter().map(|b| char::from(b.to_ascii_lowercase())));
        name.push('.');
        at += 1 + len;
    }
    if name.is_empty() {
        name.push('.');
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    query.get(at + 2..at + 4)?;
    Some(Question {
        name,
        qtype,
        end: at + 4,
    })
}

/// The largest UDP answer the client takes: its EDNS payload size when the query carries an
/// OPT record right after the question (where every resolver puts it), never under 512.
pub fn udp_limit(query: &[u8], question: &Question) -> usize {
    let arcount = query.get(10..12).map(|b| u16::from_be_bytes([b[0], b[1]]));
    if arcount.unwrap_or(0) == 0 || query.get(6..10) != Some(&[0u8, 0, 0, 0][..]) {
        return UDP_MIN;
    }
    // OPT: root name (one zero byte), TYPE 41, CLASS = payload size.
    let at = question.end;
    match query.get(at..at + 5) {
        Some(&[0, t0, t1, s0, s1]) if u16::from_be_bytes([t0, t1]) == TYPE_OPT => {
            usize::from(u16::from_be_bytes([s0, s1])).max(UDP_MIN)
        }
        _ => UDP_MIN,
    }
}

/// The response to `query` (whose question is `question`) carrying `records`, within `limit`
/// bytes: records that do not fit are left out and TC is set.
pub fn response(query: &[u8], question: &Question, records: &[Record], limit: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(question.end + records.len() * 16);
    out.extend_from_slice(&query[..2]);
    out.push(QR | (query[2] & (OPCODE | RD)) | AA);
    out.push(query[3] & CD);
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&query[HEADER_LEN..question.end]);
    let mut count: u16 = 0;
    for record in records {
        let before = out.len();
        write_record(&mut out, record, &question.name);
        if out.len() > limit || count == u16::MAX {
            out.truncate(before);
            out[2] |= TC;
            break;
        }
        count += 1;
    }
    out[6..8].copy_from_slice(&count.to_be_bytes());
    out
}

fn write_record(out: &mut Vec<u8>, record: &Record, question: &str) {
    let (owner, rtype) = match record {
        Record::Cname { owner, .. } => (owner, TYPE_CNAME),
        Record::A { owner, .. } => (owner, TYPE_A),
        Record::Aaaa { owner, .. } => (owner, TYPE_AAAA),
    };
    // The question's name is at offset 12: point there rather than spell it again.
    if owner == question {
        out.extend_from_slice(&[0xC0, HEADER_LEN as u8]);
    } else {
        write_name(out, owner);
    }
    out.extend_from_slice(&rtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&TTL.to_be_bytes());
    match record {
        Record::Cname { target, .. } => {
            let mut rdata = Vec::with_capacity(target.len() + 2);
            write_name(&mut rdata, target);
            // A name is at most 255 bytes (the table's names came from questions or istiod's
            // hostnames, checked by length when read).
            let len = u16::try_from(rdata.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&rdata);
        }
        Record::A { ip, .. } => {
            out.extend_from_slice(&4u16.to_be_bytes());
            out.extend_from_slice(&ip.octets());
        }
        Record::Aaaa { ip, .. } => {
            out.extend_from_slice(&16u16.to_be_bytes());
            out.extend_from_slice(&ip.octets());
        }
    }
}

/// A dotted name in wire format; labels over 63 bytes are cut (no such name is in a table a
/// resolver could ask for).
fn write_name(out: &mut Vec<u8>, name: &str) {
    for label in name.split('.').filter(|l| !l.is_empty()) {
        let bytes = &label.as_bytes()[..label.len().min(63)];
        out.push(bytes.len() as u8);
        out.extend_from_slice(bytes);
    }
    out.push(0);
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
