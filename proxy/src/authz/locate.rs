//! The line of a field path (`spec.rules[1].from[0].source`) in a block-style YAML document.
//!
//! serde gives a location for syntax and type errors; Istio's checks that span several fields
//! run after deserialisation, when positions are gone. This walks the text by indentation and
//! counts `- ` items for list indices, which is enough for the block style policies are written
//! in. Where it loses the trail (flow style), the deepest line it found is the answer.

/// One step of a path.
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn steps(path: &str) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key));
        }
        while let Some((index, after)) = rest.split_once(']') {
            if let Ok(i) = index.parse() {
                out.push(Step::Index(i));
            }
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    out
}

/// A content line: its number (0-based), raw indentation, and the text after it.
struct Line<'a> {
    n: usize,
    indent: usize,
    body: &'a str,
}

fn content_lines(text: &str) -> Vec<Line<'_>> {
    text.lines()
        .enumerate()
        .filter_map(|(n, raw)| {
            let body = raw.trim_start();
            let keep = !(body.is_empty() || body.starts_with('#') || body.starts_with("---"));
            keep.then(|| Line {
                n,
                indent: raw.len() - body.len(),
                body: body.trim_end(),
            })
        })
        .collect()
}

/// A key on a line, past any `- ` item markers, and the column where it starts.
fn key_of<'a>(line: &Line<'a>) -> (&'a str, usize) {
    let mut body = line.body;
    let mut indent = line.indent;
    while let Some(rest) = body.strip_prefix("- ") {
        let trimmed = rest.trim_start();
        indent += body.len() - trimmed.len();
        body = trimmed;
    }
    let key = body
        .split_once(':')
        .map_or("", |(k, _)| k.trim_matches(['"', '\'']));
    (key, indent)
}

/// 1-based line of `path` in `text`, if any step of it can be found.
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let lines = content_lines(text);
    let mut found: Option<usize> = None;
    // Lines after `at` belong to the current node while their indentation exceeds `within`.
    let mut at = 0;
    let mut within: Option<usize> = None;
    // The current node is a list item starting on line `at` (its first key shares the line).
    let mut in_item = false;
    for step in steps(path) {
        let inside =
            |i: usize, l: &Line<'_>| (in_item && i == at) || within.is_none_or(|w| l.indent > w);
        match step {
            Step::Key(key) => {
                let hit = (at..lines.len())
                    .take_while(|&i| inside(i, &lines[i]))
                    .find(|&i| key_of(&lines[i]).0 == key);
                let Some(i) = hit else { break };
                found = Some(lines[i].n);
                within = Some(key_of(&lines[i]).1);
                at = i + 1;
                in_item = false;
            }
            Step::Index(n) => {
                // Items may sit at the key's own indentation (`rules:\n- from:`).
                let floor = within.map_or(0, |w| w);
                let mut items = (at..lines.len())
                    .take_while(|&i| lines[i].indent >= floor)
                    .filter(|&i| lines[i].body.starts_with("- ") || lines[i].body == "-");
                let first = items.next();
                let Some(item_indent) = first.map(|i| lines[i].indent) else {
                    break;
                };
                let hit = first
                    .into_iter()
                    .chain(items)
                    .filter(|&i| lines[i].indent == item_indent)
                    .nth(n);
                let Some(i) = hit else { break };
                found = Some(lines[i].n);
                within = Some(item_indent);
                at = i;
                in_item = true;
            }
        }
    }
    found.map(|n| n + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: a
spec:
  action: ALLOW
  rules:
  - from:
    - source:
        principals: [\"x\"]
  - to:
    - operation:
        paths: [\"/a\"]
    from:
    - source:
        namespaces:
        - foo
        - bar
";

    #[test]
    fn paths_parse_into_steps() {
        assert_eq!(
            steps("spec.rules[1].from[0].source"),
            vec![
                Step::Key("spec"),
                Step::Key("rules"),
                Step::Index(1),
                Step::Key("from"),
                Step::Index(0),
                Step::Key("source")
            ]
        );
    }

    #[test]
    fn finds_keys_and_list_items_by_indentation() {
        assert_eq!(line_of(DOC, "spec.action"), Some(6));
        assert_eq!(line_of(DOC, "spec.rules[0].from[0].source"), Some(9));
        assert_eq!(
            line_of(DOC, "spec.rules[0].from[0].source.principals"),
            Some(10)
        );
        assert_eq!(line_of(DOC, "spec.rules[1]"), Some(11));
        assert_eq!(line_of(DOC, "spec.rules[1].from"), Some(14));
        assert_eq!(
            line_of(DOC, "spec.rules[1].from[0].source.namespaces[1]"),
            Some(18)
        );
        assert_eq!(
            line_of(DOC, "spec.rules[1].to[0].operation.paths"),
            Some(13)
        );
        // Lost in flow style: the deepest line found.
        assert_eq!(
            line_of(DOC, "spec.rules[0].from[0].source.principals[0]"),
            Some(10)
        );
        assert_eq!(line_of(DOC, "metadata.namespace"), Some(3));
    }
}
