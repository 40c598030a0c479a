//! The RAG prompt and the citations in an answer.
//!
//! The prompt numbers the passages `[1]`..`[k]` and shows one worked exchange in which the
//! answer starts with the number of its passage; the answer stage then checks each `[n]`
//! against what its sentence says and sends the passage's id (`[<document id>#<chunk>]`,
//! `pipeline/answer.rs`), so the client sees ids. Why numbers rather than the ids themselves: measured with SmolLM2-135M,
//! the model copies the numbered format every time, while with raw ids it sometimes invented
//! ids that were never retrieved (`[189#1]`); a number outside `1..=k` is caught and reported
//! as unknown instead of becoming a citation. Whatever the model writes, [`check`] splits the
//! cited ids into retrieved and unknown: a citation of anything else is never passed off as a
//! source.

use std::collections::HashSet;

use api::v1::ChatMessage;

/// A passage as the prompt shows it.
pub struct Source<'a> {
    pub id: &'a str,
    pub title: &'a str,
    pub text: &'a str,
}

const SYSTEM: &str = "You answer questions using only the numbered passages you are given. \
Start your answer with the number of the passage that answers the question, in square brackets, like [2]. \
If no passage answers it, say that the passages do not say.";

/// The worked exchange that shows the format (small models follow an example far more
/// reliably than an instruction).
const EXAMPLE_QUESTION: &str = "Question: Why is the sky blue?\n\nPassages:\n\
[1] Apples. Apples are rich in fiber.\n\
[2] Sky color. The sky looks blue because air scatters blue light more than red light.\n\n\
Answer the question, starting with the number of the passage that answers it, like [1].";
const EXAMPLE_ANSWER: &str = "[2] The sky looks blue because air scatters blue light more than red light.";

/// The chat messages for `question` over `sources`, numbered from 1, the passage texts cut
/// so that all of them together stay within `max_chars` (the first passages, the best ones,
/// keep the most).
pub fn messages(question: &str, sources: &[Source<'_>], max_chars: usize) -> Vec<ChatMessage> {
    let mut user = format!("Question: {}\n\nPassages:\n", one_line(question));
    let mut budget = max_chars;
    for (n, s) in sources.iter().enumerate() {
        let body = one_line(s.text);
        let title = one_line(s.title);
        let label = n + 1;
        let mut entry =
            if title.is_empty() { format!("[{label}] {body}\n") } else { format!("[{label}] {title}. {body}\n") };
        if entry.len() > budget {
            let mut cut = budget;
            while cut > 0 && !entry.is_char_boundary(cut) {
                cut -= 1;
            }
            entry.truncate(cut);
            if entry.trim().is_empty() {
                break;
            }
            entry.push_str("...\n");
        }
        budget = budget.saturating_sub(entry.len());
        user.push_str(&entry);
        if budget == 0 {
            break;
        }
    }
    user.push_str("\nAnswer the question, starting with the number of the passage that answers it, like [1].");
    let m = |role: &str, content: &str| ChatMessage { role: role.into(), content: content.into() };
    vec![m("system", SYSTEM), m("user", EXAMPLE_QUESTION), m("assistant", EXAMPLE_ANSWER), m("user", &user)]
}

/// Whitespace runs (newlines included) as one space, so a passage is one line of the list.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The passage ids an answer cites: every `[...]` whose content (or each comma- or
/// semicolon-separated part of it) looks like `<id>#<chunk number>`, in order of first
/// appearance, without repeats.
pub fn parse_citations(answer: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = answer;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else { break };
        let inside = &after[..close];
        // A '[' inside means the outer one was not a citation: restart from the inner one.
        if let Some(inner) = inside.rfind('[') {
            rest = &after[inner..];
            continue;
        }
        for part in inside.split([',', ';']) {
            let id = part.trim();
            if looks_like_passage_id(id) && !out.iter().any(|o| o == id) {
                out.push(id.to_string());
            }
        }
        rest = &after[close + 1..];
    }
    out
}

fn looks_like_passage_id(id: &str) -> bool {
    match id.rsplit_once('#') {
        Some((doc, chunk)) => !doc.is_empty() && !chunk.is_empty() && chunk.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Splits cited ids into those among `retrieved` and the rest.
pub fn check(cited: &[String], retrieved: &[&str]) -> (Vec<String>, Vec<String>) {
    let known: HashSet<&str> = retrieved.iter().copied().collect();
    cited.iter().cloned().partition(|c| known.contains(c.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_are_parsed_in_order_without_repeats() {
        let a = "Vitamin D matters [4983#0]. It also helps [12#3, 4983#0]; see [x#y] and [note] [a#1][b#2] [[c#4]";
        assert_eq!(parse_citations(a), vec!["4983#0", "12#3", "a#1", "b#2", "c#4"]);
        assert!(parse_citations("no citations here [ ] [#1] [a#]").is_empty());
        assert_eq!(parse_citations("unclosed [a#1"), Vec::<String>::new());
        // Ids with '#' inside keep everything before the last '#'.
        assert_eq!(parse_citations("[doc#part#7]"), vec!["doc#part#7"]);
    }

    #[test]
    fn citations_are_checked_against_the_retrieved_passages() {
        let cited = vec!["1#0".to_string(), "9#9".to_string()];
        let (known, unknown) = check(&cited, &["1#0", "2#0"]);
        assert_eq!(known, vec!["1#0"]);
        assert_eq!(unknown, vec!["9#9"]);
    }

    #[test]
    fn the_prompt_numbers_every_passage_within_the_budget() {
        let sources = [
            Source { id: "a#0", title: "Alpha", text: "first\npassage" },
            Source { id: "b#1", title: "", text: &"x".repeat(500) },
        ];
        let m = messages("What?", &sources, 200);
        assert_eq!(m.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(), ["system", "user", "assistant", "user"]);
        let user = &m[3].content;
        assert!(user.starts_with("Question: What?"), "{user}");
        assert!(user.contains("[1] Alpha. first passage"), "{user}");
        assert!(user.contains("[2] xxx"), "{user}");
        assert!(user.contains("..."), "the long passage is cut");
        assert!(user.len() < 200 + 200, "{}", user.len());
        assert!(!user.contains("a#0"), "ids are the gateway's business, not the model's");
    }
}
