//! Whether a sentence says anything beyond the question: the words it adds.
//!
//! Asked plain questions about the project's docs ("How do I run the tests?"), the small
//! generators sometimes answer with the question itself, turned into a sentence and cited
//! ("To run the tests, run the tests [README.md#4]."), although the passages they were shown
//! hold the answer. Such a sentence adds no content word to the question: every word it has is
//! a question word (or a form of one), a function word, or a word about answering itself
//! ("answer", "passage", "following"). [`adds`] counts the words a sentence adds; the answer
//! stage holds a sentence back until it adds one ([`super::answer`]). Deliberately lexical:
//! it needs no model call, and a sentence that adds a single number ("1.37") or a name is an
//! answer, however close its embedding is to the question's.

/// Function words, and words about answering rather than the subject (space-separated).
const STOP: &str = "a about according all also an and answer answers any are as at be been being both but by can context \
    could did do does doing done each excerpt following for from given had has have here how i if in \
    information into is it its just me mentioned my number of on one or our passage passages provided \
    question should so some such text that the their them then there these they this those to use used \
    uses using very was we were what when where which who whom why will with would you your";

fn is_stop(w: &str) -> bool {
    STOP.split_whitespace().any(|s| s == w)
}

/// The words of `text`, lowercased: runs of letters, digits and the joiners `. - _ / # @ : =`
/// inside them (so `1.37`, `U-Verify`, `scripts/test.sh` and `--small` are one word each),
/// with the joiners at either end trimmed.
pub fn words(text: &str) -> Vec<String> {
    let joiner = |c: char| matches!(c, '.' | '-' | '_' | '/' | '#' | '@' | ':' | '=');
    text.split(|c: char| !(c.is_alphanumeric() || joiner(c)))
        .map(|w| w.trim_matches(|c: char| joiner(c) && c != '-').trim_end_matches('-'))
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(str::to_lowercase)
        .collect()
}

/// A word's stem for comparison: `'s`, a plural or third-person `s`, `ed` and `ing` cut
/// (`uses` → `use`, `tests` → `test`, `running` → `runn`), enough to match the forms a
/// restatement turns the question's words into.
fn stem(w: &str) -> &str {
    let w = w.strip_suffix("'s").unwrap_or(w);
    for suffix in ["ing", "ed", "es", "s"] {
        if let Some(s) = w.strip_suffix(suffix)
            && s.chars().count() >= 3
            && !w.ends_with("ss")
        {
            return s;
        }
    }
    w
}

/// Whether `word` is a form of one of `question`'s words: equal stems, or one stem a prefix
/// of the other of at least three characters (`run` and `runn(ing)`).
fn in_question(word: &str, question: &[String]) -> bool {
    let s = stem(word);
    question.iter().any(|q| {
        let t = stem(q);
        s == t || (s.len().min(t.len()) >= 3 && (s.starts_with(t) || t.starts_with(s)))
    })
}

/// The content words `text` adds to `question`: its words that are neither function words
/// nor forms of the question's words. Citations (`[3]`, `[a.md#0]`) are not words.
pub fn added(text: &str, question: &str) -> Vec<String> {
    let q: Vec<String> = words(question).into_iter().filter(|w| !is_stop(w)).collect();
    words(&strip_brackets(text)).into_iter().filter(|w| !is_stop(w) && !in_question(w, &q)).collect()
}

/// How many content words `text` adds to `question` ([`added`]).
pub fn adds(text: &str, question: &str) -> usize {
    added(text, question).len()
}

/// `text` without its bracketed parts (citations).
fn strip_brackets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_keep_versions_paths_and_flags_whole() {
        assert_eq!(
            words("Run `bash scripts/test.sh` (v1.37, U-Verify, --small); done."),
            ["run", "bash", "scripts/test.sh", "v1.37", "u-verify", "--small", "done"]
        );
    }

    #[test]
    fn a_restated_question_adds_nothing() {
        let q = "Which Kubernetes version does the control plane in the tests use?";
        assert_eq!(adds("[1] The control plane in the tests uses the Kubernetes version.", q), 0);
        assert_eq!(
            adds("The version of Kubernetes used by the control plane in the tests is given in passage [2].", q),
            0
        );
        assert_eq!(added("[1] The control plane in the tests uses Kubernetes 1.37.", q), ["1.37"]);
        let q = "How do I run the tests?";
        assert_eq!(adds("To run the tests, you run the tests.", q), 0);
        assert_eq!(added("Running the tests: bash scripts/test.sh", q), ["bash", "scripts/test.sh"]);
        // An honest "the passages do not say" is an answer, not a restatement.
        assert_eq!(added("The passages do not say.", q), ["not", "say"]);
    }
}
