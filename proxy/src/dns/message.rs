//! What a forwarder needs to know of a DNS message (RFC 1035 §4.1): its header and where its
//! question ends, to match answers to queries and to build a SERVFAIL. Answers are passed on
//! byte for byte, so nothing else is ever parsed.

/// The fixed header in front of every message.
pub const HEADER_LEN: usize = 12;

const QR: u8 = 0x80;
const TC: u8 = 0x02;
const RD: u8 = 0x01;
const OPCODE: u8 = 0x78;
const RA: u8 = 0x80;
const RCODE_SERVFAIL: u8 = 2;

/// The message ID, or `None` if `msg` is too short to be DNS.
pub fn id(msg: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*msg.first()?, *msg.get(1)?]))
}

/// Whether `msg` is a query (QR clear) with a whole header: what the forwarder accepts.
pub fn is_query(msg: &[u8]) -> bool {
    msg.len() >= HEADER_LEN && msg[2] & QR == 0
}

/// Whether `answer` is a response to the query with `id`.
pub fn answers(answer: &[u8], id: u16) -> bool {
    answer.len() >= HEADER_LEN && answer[2] & QR != 0 && self::id(answer) == Some(id)
}

/// Whether the TC (truncated) flag is set: the client should ask again over TCP.
pub fn is_truncated(msg: &[u8]) -> bool {
    msg.len() >= HEADER_LEN && msg[2] & TC != 0
}

/// A SERVFAIL response to `query` (a message that passed [`is_query`]), echoing its question
/// so that resolvers, which match answers on ID and question, accept it rather than wait.
pub fn servfail(query: &[u8]) -> Vec<u8> {
    let question = question_end(query).map(|end| &query[HEADER_LEN..end]);
    let mut out = Vec::with_capacity(HEADER_LEN + question.map_or(0, <[u8]>::len));
    out.extend_from_slice(&query[..2]);
    out.push(QR | (query[2] & (OPCODE | RD)));
    out.push(RA | RCODE_SERVFAIL);
    let qdcount: u16 = if question.is_some() { 1 } else { 0 };
    out.extend_from_slice(&qdcount.to_be_bytes());
    out.extend_from_slice(&[0; 6]);
    if let Some(q) = question {
        out.extend_from_slice(q);
    }
    out
}

/// The offset just past the first question, if the message has exactly one that parses.
/// Queries carry one question in practice (RFC 9619 makes it the rule).
fn question_end(msg: &[u8]) -> Option<usize> {
    if msg.get(4..6)? != [0, 1] {
        return None;
    }
    let mut at = HEADER_LEN;
    // A name is at most 255 bytes, so at most 128 labels; the bound keeps a hostile message
    // from making us walk further.
    for _ in 0..128 {
        let len = *msg.get(at)?;
        match len {
            0 => return end_of_question(msg, at + 1),
            // A compression pointer ends the name.
            l if l & 0xC0 == 0xC0 => return end_of_question(msg, at + 2),
            l if l & 0xC0 == 0 => at += 1 + usize::from(l),
            _ => return None,
        }
    }
    None
}

/// QTYPE and QCLASS follow the name.
fn end_of_question(msg: &[u8], name_end: usize) -> Option<usize> {
    let end = name_end + 4;
    (end <= msg.len()).then_some(end)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A query for `name` (type A, class IN) with recursion desired.
    pub fn query(id: u16, name: &str) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&[RD, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.trim_end_matches('.').split('.') {
            q.push(u8::try_from(label.len()).unwrap());
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        q
    }

    #[test]
    fn servfail_echoes_id_and_question() {
        let q = query(0xBEEF, "www.example.org");
        assert!(is_query(&q));
        let s = servfail(&q);
        assert!(answers(&s, 0xBEEF));
        assert_eq!(s[3] & 0x0F, RCODE_SERVFAIL);
        assert_eq!(s[2] & RD, RD, "RD is copied");
        assert_eq!(&s[4..6], &[0, 1]);
        assert_eq!(&s[HEADER_LEN..], &q[HEADER_LEN..]);
        assert!(!is_truncated(&s));
    }

    #[test]
    fn servfail_of_an_odd_query_has_no_question() {
        let mut q = query(7, "a.b");
        q.truncate(HEADER_LEN + 3); // the name runs past the end
        let s = servfail(&q);
        assert_eq!(s.len(), HEADER_LEN);
        assert_eq!(&s[4..6], &[0, 0]);
        assert!(answers(&s, 7));
    }

    #[test]
    fn a_response_is_not_a_query_and_short_input_is_nothing() {
        let q = query(1, "x");
        assert!(!is_query(&servfail(&q)));
        assert!(!is_query(&q[..5]));
        assert_eq!(id(&[1]), None);
        assert!(!answers(&q, 1), "a query does not answer itself");
    }
}
