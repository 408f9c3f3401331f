//! Where a chunked response body ends. The fast path passes chunked bodies on as they came,
//! size lines, extensions and trailers included; it only needs to know when the last byte
//! has gone by, to pool the connection and read the client's next request.

/// A chunked body that is not well-formed: the connection cannot be trusted after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked body")]
pub struct BadChunk;

/// Follows one chunked body, fed in pieces.
#[derive(Debug, Clone, Default)]
pub struct ChunkedEnd {
    state: State,
    /// The size of the chunk being read, then what is left of its data.
    size: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// In a size line's hex digits (whether any were seen).
    #[default]
    Size,
    SizeDigits,
    /// After the size: extensions, up to the end of the line.
    Extension,
    /// After the size line's CR.
    SizeLf,
    Data,
    /// After a chunk's data: its CR LF.
    DataCr,
    DataLf,
    /// After the last (zero) chunk: at the start of a trailer line or of the final blank line.
    TrailerStart,
    TrailerLine,
    /// After the final blank line's CR.
    FinalLf,
    Done,
}

impl ChunkedEnd {
    /// Account for the next bytes of the body; `Some(n)` when the body ends after the first `n`
    /// of them.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, BadChunk> {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == State::Data {
                let n = usize::try_from(self.size)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len() - i);
                i += n;
                self.size -= n as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = bytes[i];
            i += 1;
            self.state = match (self.state, b) {
                (State::Size | State::SizeDigits, b) if b.is_ascii_hexdigit() => {
                    let digit = u64::from(match b {
                        b'0'..=b'9' => b - b'0',
                        _ => (b | 0x20) - b'a' + 10,
                    });
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(digit))
                        .ok_or(BadChunk)?;
                    State::SizeDigits
                }
                (State::SizeDigits, b';' | b' ' | b'\t') => State::Extension,
                (State::SizeDigits, b'\r') => State::SizeLf,
                (State::SizeDigits | State::SizeLf, b'\n') => self.size_line_ended(),
                (State::Extension, b'\r') => State::SizeLf,
                (State::Extension, b'\n') => self.size_line_ended(),
                (State::Extension, _) => State::Extension,
                (State::DataCr, b'\r') => State::DataLf,
                (State::DataCr | State::DataLf, b'\n') => State::Size,
                (State::TrailerStart, b'\r') => State::FinalLf,
                (State::TrailerStart | State::FinalLf, b'\n') => State::Done,
                (State::TrailerLine, b'\n') => State::TrailerStart,
                (State::TrailerStart | State::TrailerLine, _) => State::TrailerLine,
                _ => return Err(BadChunk),
            };
            if self.state == State::Done {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    fn size_line_ended(&mut self) -> State {
        if self.size == 0 {
            State::TrailerStart
        } else {
            State::Data
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `body` split every `step` bytes; where it ended, counted from the start.
    fn end_of(body: &[u8], step: usize) -> Result<Option<usize>, BadChunk> {
        let mut c = ChunkedEnd::default();
        let mut at = 0;
        for piece in body.chunks(step) {
            if let Some(n) = c.feed(piece)? {
                return Ok(Some(at + n));
            }
            at += piece.len();
        }
        Ok(None)
    }

    #[test]
    fn finds_the_end_at_every_split() {
        let body =
            b"5\r\nhello\r\n1A;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\ngrpc-status: 0\r\n\r\n";
        for step in 1..=body.len() {
            assert_eq!(end_of(body, step), Ok(Some(body.len())), "step {step}");
        }
        // Bytes after the end (a pipelined response) are not part of it.
        let mut more = body.to_vec();
        more.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(end_of(&more, more.len()), Ok(Some(body.len())));
    }

    #[test]
    fn an_unfinished_body_has_no_end_yet() {
        assert_eq!(end_of(b"5\r\nhel", 100), Ok(None));
        assert_eq!(end_of(b"0\r\n", 100), Ok(None));
        assert_eq!(end_of(b"0\r\nx: y\r\n", 100), Ok(None));
        assert_eq!(end_of(b"0\r\n\r\n", 100), Ok(Some(5)));
        assert_eq!(end_of(b"0\n\n", 100), Ok(Some(3)));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        assert_eq!(end_of(b"z\r\n", 100), Err(BadChunk));
        assert_eq!(end_of(b"\r\n", 100), Err(BadChunk));
        assert_eq!(end_of(b"3\r\nabcX", 100), Err(BadChunk));
        assert_eq!(end_of(b"fffffffffffffffff\r\n", 100), Err(BadChunk));
    }
}
