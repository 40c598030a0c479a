//! Markdown documents as sections, and their text as the embedder should read it.
//!
//! A window of tokens laid over a whole markdown file straddles its sections: the passage of
//! README.md that names `bash scripts/test.sh` began in the web console's section (the API's
//! keys and origins) and ended in the list of what `scripts/setup.sh` installs, and its
//! embedding, an average of all of that, ranked 161st of 797 for "How do I run the tests?".
//! The chunker therefore cuts at headings first ([`sections`]): a window never crosses one,
//! and every passage is embedded with the headings it sits under, its text stripped of the
//! markdown syntax ([`plain`]) that a sentence embedder reads as words (backticks, table
//! pipes, `**`, link targets).

use std::ops::Range;

/// One section of a markdown text: from its heading line (or the text's start) to the next
/// heading line, with the headings it sits under, outermost first, its own last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub bytes: Range<usize>,
    pub headings: Vec<String>,
}

/// The heading a line makes, with its level: an ATX heading (`#` to `######`, a space, text).
fn heading(line: &str) -> Option<(usize, &str)> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let level = t.bytes().take_while(|&b| b == b'#').count();
    let rest = &t[level..];
    if !(1..=6).contains(&level) || !rest.starts_with([' ', '\t']) {
        return None;
    }
    let text = rest.trim().trim_end_matches('#').trim();
    (!text.is_empty()).then_some((level, text))
}

fn fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// The sections of `text`, in order, covering it, or `None` when it has no heading (not
/// markdown, or markdown without structure). A section with nothing but its heading is
/// joined to the next one, whose headings name it.
pub fn sections(text: &str) -> Option<Vec<Section>> {
    let mut out: Vec<Section> = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut start = 0;
    let mut in_code = false;
    let mut at = 0;
    let mut any = false;
    for line in text.split_inclusive('\n') {
        let here = at;
        at += line.len();
        if fence(line) {
            in_code = !in_code;
            continue;
        }
        let Some((level, title)) = heading(line.trim_end_matches(['\n', '\r'])).filter(|_| !in_code) else {
            continue;
        };
        any = true;
        if here > start {
            out.push(Section { bytes: start..here, headings: stack.iter().map(|(_, h)| h.clone()).collect() });
        }
        stack.retain(|(l, _)| *l < level);
        stack.push((level, inline(title)));
        start = here;
    }
    if !any {
        return None;
    }
    out.push(Section { bytes: start..text.len(), headings: stack.into_iter().map(|(_, h)| h).collect() });
    // A heading with no text under it before the next: its section joins the next one.
    let mut merged: Vec<Section> = Vec::with_capacity(out.len());
    let mut carry: Option<usize> = None;
    let n = out.len();
    for (i, mut s) in out.into_iter().enumerate() {
        if let Some(from) = carry.take() {
            s.bytes.start = from;
        }
        if i + 1 < n && plain(&text[s.bytes.clone()]).is_empty() {
            carry = Some(s.bytes.start);
            continue;
        }
        merged.push(s);
    }
    Some(merged)
}

/// `text` as prose for the embedder: heading lines, code fences and table rules left out
/// (the headings are given as context instead), list and quote markers and table pipes
/// dropped, inline code, emphasis and links reduced to their words, all on one line.
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || fence(t) || heading(line).is_some() {
            continue;
        }
        if t.starts_with('|') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' ')) {
            continue;
        }
        let t = t.trim_start_matches('>').trim_start();
        let t = ["* ", "- ", "+ "].iter().find_map(|m| t.strip_prefix(m)).unwrap_or(t);
        let line = inline(&t.replace('|', " "));
        if !line.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&line);
        }
    }
    out
}

/// One line's inline markdown reduced to its words: `[words](target)` and `![words](target)`
/// to `words`, `<https://…>` to the address, backticks and `**`/`__` emphasis dropped, runs
/// of whitespace as one space.
fn inline(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let (before, after) = rest.split_at(open);
        out.push_str(before.strip_suffix('!').unwrap_or(before));
        let link = after.find("](").and_then(|mid| {
            let close = after[mid..].find(')')? + mid;
            (!after[1..mid].contains('[')).then_some((mid, close))
        });
        match link {
            Some((mid, close)) => {
                out.push_str(&after[1..mid]);
                rest = &after[close + 1..];
            }
            None => {
                if before.ends_with('!') {
                    out.push('!');
                }
                out.push('[');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    let mut out = out.replace("**", "").replace("__", "").replace('`', "");
    let mut from = 0;
    while let Some(i) = out[from..].find("<http").map(|i| i + from) {
        let Some(j) = out[i..].find('>').map(|j| j + i) else { break };
        out.replace_range(j..=j, "");
        out.replace_range(i..=i, "");
        from = j - 1;
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# GELO\n\nIntro line.\n\n## Run it\n\n```sh\n# not a heading\ncargo run\n```\n\n\
                       ## Test it\n\n### Fast\n\nRun `bash scripts/test.sh`.\n";

    #[test]
    fn sections_end_at_headings_outside_code_and_carry_their_path() {
        let s = sections(DOC).unwrap();
        let texts: Vec<&str> = s.iter().map(|s| &DOC[s.bytes.clone()]).collect();
        assert_eq!(
            texts,
            [
                "# GELO\n\nIntro line.\n\n",
                "## Run it\n\n```sh\n# not a heading\ncargo run\n```\n\n",
                "## Test it\n\n### Fast\n\nRun `bash scripts/test.sh`.\n"
            ]
        );
        let heads: Vec<Vec<String>> = s.iter().map(|s| s.headings.clone()).collect();
        assert_eq!(heads, [vec!["GELO"], vec!["GELO", "Run it"], vec!["GELO", "Test it", "Fast"]]);
        assert_eq!(s.first().unwrap().bytes.start, 0);
        assert_eq!(s.last().unwrap().bytes.end, DOC.len());
        assert_eq!(sections("No heading here.\n#hashtag is not one\n"), None);
        // A lone heading at the end keeps its section: nothing of the text is lost.
        assert_eq!(sections("text\n## End\n").unwrap().len(), 2);
    }

    #[test]
    fn plain_text_keeps_the_words_and_drops_the_syntax() {
        let md = "## Heading\n> quoted **bold** text\n- item with `code` and [a link](https://x.y/z)\n\
                  | a | b |\n|---|:--:|\n| `--small` | SmolLM2 |\n```sh\nbash scripts/test.sh\n```\n\
                  See <http://127.0.0.1:8080/> and ![img](p.png) [not a link]\n";
        assert_eq!(
            plain(md),
            "quoted bold text item with code and a link a b --small SmolLM2 bash scripts/test.sh \
             See http://127.0.0.1:8080/ and img [not a link]"
        );
    }
}
