//! What of each retrieved passage the generator is shown: its sentences closest to the
//! question, best first.
//!
//! A passage is a window of tokens: it starts and ends mid-sentence, and the sentence that
//! answers is anywhere inside it. Measured on `eval/rag/questions.jsonl`, the small
//! generators that can be installed offline answer by copying the opening words of a passage
//! after its number, so a whole passage put the wrong words first (a heading, a half
//! sentence) even when the fact was in it. The gateway therefore splits each passage into
//! units (sentences, list items, table rows, code lines; [`units`]), scores every unit
//! against the question with the embedder (cosine of sentence embeddings, which is what
//! all-MiniLM-L6-v2 was trained for, plus a share for the question's terms the unit has:
//! `pipeline::answer::add_overlap`), and shows each passage as its best unit followed by the
//! units after it, with the passages ordered by their best unit ([`excerpts`]). The citation
//! still names the passage, whose text contains every word shown.

/// Units longer than this are cut (a unit is a sentence; longer ones are tables or code).
const MAX_UNIT_CHARS: usize = 400;

/// A passage's text as units, in order: sentences of its paragraphs, list items, table rows
/// (cells joined by `; `) and code lines. Headings, fences, table rules and units of fewer
/// than three words are left out.
pub fn units(text: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    let mut paragraph = String::new();
    let mut in_code = false;
    let flush = |p: &mut String, blocks: &mut Vec<String>| {
        if !p.trim().is_empty() {
            blocks.extend(sentences(p));
        }
        p.clear();
    };
    for raw in text.lines() {
        let line = raw.trim();
        if line.starts_with("```") {
            flush(&mut paragraph, &mut blocks);
            in_code = !in_code;
            continue;
        }
        if in_code {
            if !line.is_empty() {
                blocks.push(line.to_string());
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            flush(&mut paragraph, &mut blocks);
            continue;
        }
        if line.starts_with('|') {
            flush(&mut paragraph, &mut blocks);
            let cells: Vec<&str> = line.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
            if !cells.iter().all(|c| c.chars().all(|ch| matches!(ch, '-' | ':' | ' '))) {
                blocks.push(cells.join("; "));
            }
            continue;
        }
        if let Some(item) = list_item(line) {
            flush(&mut paragraph, &mut blocks);
            paragraph.push_str(item);
            continue;
        }
        if !paragraph.is_empty() {
            paragraph.push(' ');
        }
        paragraph.push_str(line);
    }
    flush(&mut paragraph, &mut blocks);
    blocks.into_iter().map(|u| cut(u.trim(), MAX_UNIT_CHARS)).filter(|u| u.split_whitespace().count() >= 3).collect()
}

/// Whether `unit` quotes `question` (case and spacing aside): such a unit — an example
/// command that asks it, a list of questions — scores highest and answers nothing.
pub fn quotes(unit: &str, question: &str) -> bool {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    let q = norm(question);
    !q.is_empty() && norm(unit).contains(&q)
}

/// The text of a list item (`* `, `- `, `+ `, `1. `, `> `), or `None` for another line.
fn list_item(line: &str) -> Option<&str> {
    for marker in ["* ", "- ", "+ ", "> "] {
        if let Some(rest) = line.strip_prefix(marker) {
            return Some(rest);
        }
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 {
        let rest = &line[digits..];
        if let Some(item) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            return Some(item);
        }
    }
    None
}

/// A paragraph cut after `.`, `?` or `!` where a space and a capital letter, digit, backtick
/// or opening bracket follow (so `e.g. this` and `v1.2` stay whole).
fn sentences(paragraph: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = paragraph.char_indices().collect();
    for w in chars.windows(3) {
        let [(_, end), (_, space), (next_at, next)] = *w else { continue };
        if matches!(end, '.' | '?' | '!')
            && space == ' '
            && (next.is_uppercase() || next.is_ascii_digit() || matches!(next, '`' | '(' | '[' | '*' | '"'))
        {
            out.push(paragraph[start..next_at].trim().to_string());
            start = next_at;
        }
    }
    out.push(paragraph[start..].trim().to_string());
    out.retain(|s| !s.is_empty());
    out
}

/// `s` cut to at most `max` bytes at a character boundary, with `...` when cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// One passage as the generator is shown it.
#[derive(Debug, Clone, PartialEq)]
pub struct Excerpt {
    /// Index of the passage among those retrieved.
    pub passage: usize,
    pub text: String,
    /// Score of its best unit.
    pub score: f32,
}

/// Excerpts of passages from their units and each unit's score: a passage's best unit and
/// the `per_passage - 1` units after it (fewer if they end first), passages ordered by their
/// best unit, highest first (ties keep retrieval order). A passage with no units is left out.
pub fn excerpts(passage_units: &[Vec<String>], scores: &[Vec<f32>], per_passage: usize) -> Vec<Excerpt> {
    let mut out: Vec<Excerpt> = Vec::new();
    for (i, (units, scores)) in passage_units.iter().zip(scores).enumerate() {
        let Some((best, &score)) = scores.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        else {
            continue;
        };
        let end = (best + per_passage.max(1)).min(units.len());
        out.push(Excerpt { passage: i, text: units[best..end].join(" "), score });
    }
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.passage.cmp(&b.passage)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_sentences_items_rows_and_code_lines() {
        let text = "ntinued from the last chunk. GELO keeps prompts in the CVM, e.g. tokens.\n\
                    Wrapped lines join\nthe paragraph. Version v1.2 is fine!\n\n\
                    ## A heading line\n\
                    * a list item with words\n- another list item here\n1. numbered item one two\n\
                    | flag | what it does |\n|---|:---:|\n| `--qwen` | Qwen2.5 as generator |\n\
                    ```sh\ncargo run --release -p gelo -- up\n```\nshort\n";
        assert_eq!(
            units(text),
            vec![
                "ntinued from the last chunk.",
                "GELO keeps prompts in the CVM, e.g. tokens.",
                "Wrapped lines join the paragraph.",
                "Version v1.2 is fine!",
                "a list item with words",
                "another list item here",
                "numbered item one two",
                "flag; what it does",
                "`--qwen`; Qwen2.5 as generator",
                "cargo run --release -p gelo -- up",
            ]
        );
    }

    #[test]
    fn a_unit_that_quotes_the_question_is_recognised() {
        let q = "Where does every product run?";
        assert!(quotes("gelo query \"Where does every  product RUN?\"   # streams a cited answer", q));
        assert!(!quotes("Every product runs on the CVM's CPU.", q));
        assert!(!quotes("anything", "  "));
    }

    #[test]
    fn a_long_unit_is_cut_at_a_character_boundary() {
        let long = "é ".repeat(400);
        let u = units(&long);
        assert_eq!(u.len(), 1);
        assert!(u[0].len() <= MAX_UNIT_CHARS + 3 && u[0].ends_with("..."));
    }

    #[test]
    fn each_passage_shows_its_best_unit_first_and_the_best_passage_comes_first() {
        let units = vec![
            vec!["a0".to_string(), "a1".into(), "a2".into()],
            vec!["b0".to_string(), "b1".into()],
            Vec::new(),
            vec!["c0".to_string()],
        ];
        let scores = vec![vec![0.1, 0.5, 0.2], vec![0.3, 0.9], Vec::new(), vec![0.5]];
        let e = excerpts(&units, &scores, 2);
        assert_eq!(
            e,
            vec![
                Excerpt { passage: 1, text: "b1".into(), score: 0.9 },
                Excerpt { passage: 0, text: "a1 a2".into(), score: 0.5 },
                Excerpt { passage: 3, text: "c0".into(), score: 0.5 },
            ]
        );
        // One unit per passage shows only the best.
        assert_eq!(excerpts(&units, &scores, 1)[1].text, "a1");
    }
}
