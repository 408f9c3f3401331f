//! Reading a TLS ClientHello without terminating it: the server name and the ALPN protocols
//! offered, which tell mesh mutual TLS (Istio's ALPN values) from an application's own TLS.
//!
//! The parse is bounded by the bytes detection read and never trusts a length beyond them; a
//! malformed hello is "not a ClientHello", which callers treat as opaque bytes.

/// What a ClientHello offers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientHello {
    /// The server name (SNI), if sent.
    pub server_name: Option<String>,
    /// The ALPN protocols offered, in the client's order.
    pub alpn: Vec<Vec<u8>>,
}

impl ClientHello {
    /// Whether any of `protocols` is offered.
    pub fn offers_any(&self, protocols: &[&[u8]]) -> bool {
        self.alpn.iter().any(|p| protocols.contains(&p.as_slice()))
    }
}

/// The outcome of reading the first bytes as a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Complete(ClientHello),
    /// A consistent start; more bytes are needed.
    Incomplete,
    /// Not a TLS ClientHello.
    Invalid,
}

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;

/// Parse the ClientHello at the start of `bytes`, reassembling it across handshake records.
pub fn parse(bytes: &[u8]) -> Parsed {
    let mut message = Vec::new();
    let mut rest = bytes;
    // The handshake message's length, once its header has arrived.
    let mut wanted: Option<usize> = None;
    loop {
        if rest.len() < 5 {
            return Parsed::Incomplete;
        }
        if rest[0] != HANDSHAKE || rest[1] != 3 {
            return Parsed::Invalid;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 {
            return Parsed::Invalid;
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            // Take what has arrived of this record to learn the message length early.
            message.extend_from_slice(&rest[5..]);
            return match header(&message) {
                Some(Err(())) => Parsed::Invalid,
                _ => Parsed::Incomplete,
            };
        };
        message.extend_from_slice(fragment);
        rest = &rest[5 + len..];
        if wanted.is_none() {
            match header(&message) {
                Some(Ok(n)) => wanted = Some(n),
                Some(Err(())) => return Parsed::Invalid,
                None => continue,
            }
        }
        if let Some(n) = wanted {
            if message.len() >= 4 + n {
                return match body(&message[4..4 + n]) {
                    Some(hello) => Parsed::Complete(hello),
                    None => Parsed::Invalid,
                };
            }
        }
    }
}

/// The handshake header: `Ok(length)` of a ClientHello, `Err` for another message, `None`
/// while incomplete.
fn header(message: &[u8]) -> Option<Result<usize, ()>> {
    let h = message.get(..4)?;
    if h[0] != CLIENT_HELLO {
        return Some(Err(()));
    }
    Some(Ok(usize::from(h[1]) << 16
        | usize::from(h[2]) << 8
        | usize::from(h[3])))
}

/// A cursor over a byte slice that never reads past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a one- or two-byte length prefix.
    fn vec8(&mut self) -> Option<Reader<'a>> {
        let n = self.u8()?;
        self.take(n).map(Reader)
    }

    fn vec16(&mut self) -> Option<Reader<'a>> {
        let n = self.u16()?;
        self.take(n).map(Reader)
    }
}

/// The ClientHello body (RFC 8446 §4.1.2): version, random, session id, cipher suites,
/// compression methods, extensions.
fn body(b: &[u8]) -> Option<ClientHello> {
    let mut r = Reader(b);
    r.take(2 + 32)?;
    r.vec8()?;
    r.vec16()?;
    r.vec8()?;
    let mut hello = ClientHello::default();
    if r.0.is_empty() {
        // No extensions at all (an old client): no SNI, no ALPN.
        return Some(hello);
    }
    let mut extensions = r.vec16()?;
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let mut data = extensions.vec16()?;
        match u16::try_from(kind).ok()? {
            EXT_SERVER_NAME => {
                let mut list = data.vec16()?;
                while !list.0.is_empty() {
                    let name_type = list.u8()?;
                    let name = list.vec16()?;
                    if name_type == 0 {
                        hello.server_name = std::str::from_utf8(name.0).ok().map(str::to_string);
                    }
                }
            }
            EXT_ALPN => {
                let mut list = data.vec16()?;
                while !list.0.is_empty() {
                    let p = list.vec8()?;
                    hello.alpn.push(p.0.to_vec());
                }
            }
            _ => {}
        }
    }
    Some(hello)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as a client library writes it, with SNI and ALPN.
    fn hello(sni: &str, alpn: &[&[u8]]) -> Vec<u8> {
        let mut ext = Vec::new();
        let mut sni_list = vec![0u8];
        sni_list.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        sni_list.extend_from_slice(sni.as_bytes());
        let mut sni_ext = (sni_list.len() as u16).to_be_bytes().to_vec();
        sni_ext.extend(sni_list);
        ext.extend_from_slice(&0u16.to_be_bytes());
        ext.extend_from_slice(&(sni_ext.len() as u16).to_be_bytes());
        ext.extend(sni_ext);
        let mut protos = Vec::new();
        for p in alpn {
            protos.push(p.len() as u8);
            protos.extend_from_slice(p);
        }
        let mut alpn_ext = (protos.len() as u16).to_be_bytes().to_vec();
        alpn_ext.extend(protos);
        ext.extend_from_slice(&16u16.to_be_bytes());
        ext.extend_from_slice(&(alpn_ext.len() as u16).to_be_bytes());
        ext.extend(alpn_ext);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut msg = vec![1];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend(body);
        let mut record = vec![22, 3, 1];
        record.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        record.extend(msg);
        record
    }

    #[test]
    fn reads_sni_and_alpn() {
        let bytes = hello(
            "outbound_.80_._.reviews",
            &[b"istio-peer-exchange", b"istio"],
        );
        let Parsed::Complete(h) = parse(&bytes) else {
            panic!("not parsed")
        };
        assert_eq!(h.server_name.as_deref(), Some("outbound_.80_._.reviews"));
        assert_eq!(
            h.alpn,
            vec![b"istio-peer-exchange".to_vec(), b"istio".to_vec()]
        );
        assert!(h.offers_any(&[b"istio"]));
    }

    #[test]
    fn every_prefix_is_incomplete_and_garbage_is_invalid() {
        let bytes = hello("a", &[b"h2"]);
        for n in 0..bytes.len() {
            assert_eq!(parse(&bytes[..n]), Parsed::Incomplete, "prefix of {n}");
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Parsed::Invalid);
        let mut bad = bytes.clone();
        bad[5] = 2; // a ServerHello
        assert_eq!(parse(&bad), Parsed::Invalid);
        // A length that runs past the record is invalid, not a panic.
        let mut short = bytes;
        short[44] = 0xff;
        assert!(matches!(
            parse(&short),
            Parsed::Invalid | Parsed::Complete(_)
        ));
    }

    #[test]
    fn a_hello_split_across_records_is_reassembled() {
        let one = hello("svc", &[b"istio"]);
        let msg = &one[5..];
        let (a, b) = msg.split_at(20);
        let mut two = Vec::new();
        for part in [a, b] {
            two.extend_from_slice(&[22, 3, 3]);
            two.extend_from_slice(&(part.len() as u16).to_be_bytes());
            two.extend_from_slice(part);
        }
        let Parsed::Complete(h) = parse(&two) else {
            panic!("not parsed")
        };
        assert_eq!(h.alpn, vec![b"istio".to_vec()]);
    }
}
