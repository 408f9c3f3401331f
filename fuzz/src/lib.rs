//! Helpers shared by Remora's fuzz targets (`fuzz_targets/`): how one input becomes the pieces
//! a parser is fed, so that every target cuts its input the same way.

/// Splits `data` at the cut points its first byte encodes: the byte seeds a simple generator
/// of piece lengths, so that the fuzzer explores how a stream parser is fed (one byte at a
/// time, a whole message, anything between) without a structured input.
pub fn pieces(data: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let Some((&seed, rest)) = data.split_first() else {
        return (Vec::new(), data);
    };
    let mut out = Vec::new();
    let mut state = u32::from(seed) | 1;
    let mut at = 0;
    while at < rest.len() {
        // xorshift: any seed gives a fixed, varied sequence of lengths from 1 to 64.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let len = if seed == 0 {
            rest.len()
        } else {
            (state % 64) as usize + 1
        };
        let end = (at + len).min(rest.len());
        out.push(&rest[at..end]);
        at = end;
    }
    (out, rest)
}

/// Splits `data` into NUL-separated strings, lossily decoded: a command line from bytes.
pub fn words(data: &[u8]) -> Vec<String> {
    data.split(|&b| b == 0)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect()
}
