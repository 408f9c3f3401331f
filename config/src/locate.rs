//! Find the line of a dotted field path in block-style YAML.
//!
//! serde reports a location for syntax and type errors, but checks that span several fields run
//! after deserialisation, when positions are gone. This walks the text by indentation, which is
//! enough for the block mappings a config is written in; flow style simply yields `None`.

/// 1-based line of `path` (`a.b.c`, list indices ignored) in `text`, if it can be found.
pub(crate) fn line_of(text: &str, path: &str) -> Option<usize> {
    let keys: Vec<&str> = path
        .split('.')
        .filter(|k| !k.is_empty() && k.parse::<usize>().is_err() && !k.starts_with('['))
        .map(|k| k.split('[').next().unwrap_or(k))
        .collect();
    if keys.is_empty() {
        return None;
    }
    let mut depth = 0;
    let mut parent_indent: Option<usize> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let indent = line.len() - body.len();
        if let Some(p) = parent_indent {
            if indent <= p {
                // Left the mapping we were searching in without finding the key.
                return None;
            }
        }
        let key = body.trim_start_matches("- ");
        if let Some(rest) = key.strip_prefix(keys[depth]) {
            if rest.trim_start().starts_with(':') {
                if depth + 1 == keys.len() {
                    return Some(i + 1);
                }
                depth += 1;
                parent_indent = Some(indent);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::line_of;

    #[test]
    fn finds_nested_keys_by_indentation() {
        let text = "outbound:\n  port: 1\ninbound:\n  # c\n  port: 2\n";
        assert_eq!(line_of(text, "inbound.port"), Some(5));
        assert_eq!(line_of(text, "outbound.port"), Some(2));
        assert_eq!(line_of(text, "inbound"), Some(3));
        assert_eq!(line_of(text, "inbound.missing"), None);
    }
}
