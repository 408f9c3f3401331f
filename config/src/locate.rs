//! Find the line of a dotted field path in block-style YAML.
//!
//! serde reports a location for syntax and type errors, but checks that span several fields run
//! after deserialisation, when positions are gone. This walks the text by indentation, which is
//! enough for the block mappings a config is written in; flow style simply yields `None`.

/// 1-based line of `path` (`a.b.c`, `listeners.1.address`: a number is the index of a list
/// item) in `text`, if it can be found.
pub(crate) fn line_of(text: &str, path: &str) -> Option<usize> {
    let segments: Vec<Segment> = path
        .split('.')
        .filter(|k| !k.is_empty() && !k.starts_with('['))
        .map(|k| match k.parse::<usize>() {
            Ok(n) => Segment::Item(n),
            Err(_) => Segment::Key(k.split('[').next().unwrap_or(k)),
        })
        .collect();
    let lines: Vec<Line> = text
        .lines()
        .enumerate()
        .filter_map(|(i, raw)| {
            let line = raw.trim_end();
            let body = line.trim_start();
            (!body.is_empty() && !body.starts_with('#')).then(|| Line {
                number: i + 1,
                indent: line.len() - body.len(),
                body,
            })
        })
        .collect();
    let mut at = Cursor {
        next: 0,
        parent: None,
        inside_item: false,
    };
    let mut found = None;
    for segment in segments {
        found = Some(match segment {
            Segment::Key(key) => at.key(&lines, key)?,
            Segment::Item(n) => at.item(&lines, n)?,
        });
    }
    found
}

enum Segment<'a> {
    Key(&'a str),
    Item(usize),
}

struct Line<'a> {
    number: usize,
    indent: usize,
    body: &'a str,
}

/// Where the search stands: the next line to look at, the indentation of the node searched
/// in (a line at or left of it leaves that node), and whether the next line is the list item
/// just entered, whose first key shares its line with the dash.
struct Cursor {
    next: usize,
    parent: Option<usize>,
    inside_item: bool,
}

impl Cursor {
    fn key(&mut self, lines: &[Line], key: &str) -> Option<usize> {
        let first = self.next;
        for (i, line) in lines.iter().enumerate().skip(first) {
            let item_line = i == first && self.inside_item;
            if !item_line && self.parent.is_some_and(|p| line.indent <= p) {
                return None;
            }
            let (indent, body) = match line.body.strip_prefix("- ") {
                Some(rest) => (line.indent + 2, rest.trim_start()),
                None => (line.indent, line.body),
            };
            if let Some(rest) = body.strip_prefix(key) {
                if rest.trim_start().starts_with(':') {
                    (self.next, self.parent, self.inside_item) = (i + 1, Some(indent), false);
                    return Some(line.number);
                }
            }
        }
        None
    }

    /// The `n`th item of the list under the key just found; YAML lets its dashes sit at the
    /// key's own indentation.
    fn item(&mut self, lines: &[Line], n: usize) -> Option<usize> {
        let mut items = lines
            .iter()
            .enumerate()
            .skip(self.next)
            .take_while(|(_, l)| {
                let dash = l.body.starts_with("- ") || l.body == "-";
                self.parent
                    .is_none_or(|p| l.indent > p || (dash && l.indent == p))
            });
        let (_, first) = items.next()?;
        let item_indent = first.indent;
        let (i, line) = std::iter::once((self.next, first))
            .chain(items)
            .filter(|(_, l)| l.indent == item_indent && l.body.starts_with('-'))
            .nth(n)?;
        (self.next, self.parent, self.inside_item) = (i, Some(item_indent), true);
        Some(line.number)
    }
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

    #[test]
    fn a_number_is_a_list_items_index_with_dashes_indented_or_not() {
        for text in [
            "listeners:\n  - address: a\n    upstream: b\n  - address: c\n    tls:\n      mode: x\nport: 1\n",
            "listeners:\n- address: a\n  upstream: b\n- address: c\n  tls:\n    mode: x\nport: 1\n",
        ] {
            assert_eq!(line_of(text, "listeners.0.address"), Some(2), "{text}");
            assert_eq!(line_of(text, "listeners.0.upstream"), Some(3), "{text}");
            assert_eq!(line_of(text, "listeners.1.address"), Some(4), "{text}");
            assert_eq!(line_of(text, "listeners.1.tls.mode"), Some(6), "{text}");
            assert_eq!(line_of(text, "listeners.1.upstream"), None, "{text}");
            assert_eq!(line_of(text, "listeners.2.address"), None, "{text}");
            assert_eq!(line_of(text, "port"), Some(7), "{text}");
        }
    }
}
