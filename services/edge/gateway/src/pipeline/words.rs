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
//!
//! The same words weigh the units the focus chooses from ([`overlap`]): an embedding of a
//! long sentence is an average of everything it says, so a sentence that names the
//! question's terms among many others (`… a real control plane on loopback … built by
//! scripts/k8s/build.sh (k8s.io/kubernetes v1.37.2 …)`) scores below a short neighbour that
//! shares its topic and none of its terms (`There is no kubelet …`).

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

/// The terms of `text` for [`overlap`]: [`words`] taken apart at their joiners
/// (`k8s.io/kubernetes` gives `k8s`, `io` and `kubernetes`), function words left out.
fn terms(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !is_stop(w))
        .collect()
}

/// Whether two terms are forms of one word: equal stems, or one stem a prefix of the other
/// of at least four characters (`version` and `versions`, `test` and `tests`).
fn same_term(a: &str, b: &str) -> bool {
    let (s, t) = (stem(a), stem(b));
    s == t || (s.len().min(t.len()) >= 4 && (s.starts_with(t) || t.starts_with(s)))
}

/// For each of `units`, the share of `question`'s terms it has, each term weighted by its
/// rarity among `units` (`ln(1 + n / (1 + units with it))`: a term most units have tells them
/// apart by little); in `0..=1`, all `0` for a question without terms.
pub fn overlap(question: &str, units: &[&str]) -> Vec<f32> {
    let mut q: Vec<String> = Vec::new();
    for t in terms(question) {
        if !q.contains(&t) {
            q.push(t);
        }
    }
    let units: Vec<Vec<String>> = units.iter().map(|u| terms(u)).collect();
    let n = units.len() as f32;
    let has: Vec<Vec<bool>> =
        q.iter().map(|t| units.iter().map(|u| u.iter().any(|w| same_term(t, w))).collect()).collect();
    let idf: Vec<f32> = has.iter().map(|h| (1.0 + n / (1.0 + h.iter().filter(|&&b| b).count() as f32)).ln()).collect();
    let total: f32 = idf.iter().sum();
    if total == 0.0 {
        return vec![0.0; units.len()];
    }
    (0..units.len()).map(|j| (0..q.len()).filter(|&i| has[i][j]).map(|i| idf[i]).sum::<f32>() / total).collect()
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

    #[test]
    fn the_unit_with_the_questions_rarer_terms_overlaps_most() {
        let q = "Which Kubernetes version does the control plane in the tests use?";
        let units = [
            "Run by scripts/test.sh: a real control plane, built at pinned versions (k8s.io/kubernetes v1.37.2).",
            "There is no kubelet: kubelet.py plays it for the test namespace.",
            "The tests run on two cores.",
        ];
        let o = overlap(q, &units);
        // Every term is in the first unit, joined or not (`scripts/test.sh`, `versions`,
        // `k8s.io/kubernetes`).
        assert!((o[0] - 1.0).abs() < 1e-6, "{o:?}");
        // `test` is in all three, so it weighs least: the others have little.
        assert!(o[1] > 0.0 && o[1] < 0.2 && (o[1] - o[2]).abs() < 1e-6, "{o:?}");
        assert_eq!(overlap("What is it?", &units), [0.0, 0.0, 0.0], "no terms, no overlap");
        assert!(overlap(q, &[]).is_empty());
    }
}
