//! The generator's text as the client receives it, sentence by sentence.
//!
//! The prompt has the generator cite passages by number (`[2] The sky looks blue …`,
//! [`crate::prompt`]). Between the generator and the client, [`Composer`] does two things:
//!
//! * **It holds back a restated question.** Until the answer has let a sentence through, a
//!   sentence is held until it adds a content word to the question ([`super::words`]); one
//!   that ends without adding any is left out, its citations kept for the next sentence. An
//!   answer that lets nothing through is replaced by the caller ([`Composer::released`]).
//!   Text streams as it comes once the first such word arrives, usually within the first
//!   words of the answer.
//! * **It places each citation after the sentence it cites for**, as [`Out::Cite`] with the
//!   sentence's text, so that the caller can check the sentence against the passages
//!   before naming one. A citation that opens a sentence (the prompt's format) is sent at its
//!   end, before its final punctuation (`… on the comb [bees.txt#0].`); one written after a
//!   sentence's words is sent where it stands.
//!
//! Numbers outside `1..=k` stay in the text as written and are recorded in
//! [`Composer::unknown`]; other bracketed text (`[note]`) is text.

use super::words;

/// What to send next, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    Text(String),
    /// The passages (numbers from 1) that `sentence` cites, to be checked and sent as `[id]`.
    Cite {
        sentence: String,
        numbers: Vec<usize>,
    },
}

/// An open bracket longer than this is not a citation; it is passed through as text.
const MAX_BRACKET: usize = 48;

pub struct Composer {
    question: String,
    /// Passages the prompt numbered.
    k: usize,
    /// Raw text not yet taken apart: an unfinished bracket.
    input: String,
    /// The current sentence's text, citations taken out.
    cur: String,
    /// Bytes of `cur` already sent.
    sent: usize,
    /// Citations of the current sentence, sent at its end.
    lead: Vec<usize>,
    released: bool,
    started: bool,
    /// The last sentence that ended, for a citation that comes after it.
    last: String,
    /// Sentences left out as restating the question.
    dropped: Vec<String>,
    out: Vec<Out>,
    pub unknown: Vec<String>,
}

impl Composer {
    pub fn new(question: &str, k: usize) -> Self {
        Composer {
            question: question.to_string(),
            k,
            input: String::new(),
            cur: String::new(),
            sent: 0,
            lead: Vec::new(),
            released: false,
            started: false,
            last: String::new(),
            dropped: Vec::new(),
            out: Vec::new(),
            unknown: Vec::new(),
        }
    }

    /// Whether a sentence that adds to the question has been let through.
    pub fn released(&self) -> bool {
        self.released
    }

    /// The sentences left out as restating the question, and the citations they carried:
    /// what the generator wrote, for an answer that let nothing through and has no better
    /// replacement.
    pub fn dropped(&self) -> (String, Vec<usize>) {
        (self.dropped.join(" "), self.lead.clone())
    }

    /// Takes the next piece of the generator's text; returns what can be sent now.
    pub fn push(&mut self, piece: &str) -> Vec<Out> {
        self.input.push_str(piece);
        loop {
            let Some(open) = self.input.find('[') else {
                let text = std::mem::take(&mut self.input);
                self.text(&text);
                break;
            };
            let before = self.input[..open].to_string();
            self.text(&before);
            let rest = self.input[open..].to_string();
            match rest[1..].find(['[', ']']) {
                Some(i) if rest.as_bytes()[1 + i] == b']' => {
                    self.input = rest[2 + i..].to_string();
                    self.bracket(&rest[1..1 + i]);
                }
                // Another '[' first: this one was not a citation.
                Some(i) => {
                    self.input = rest[1 + i..].to_string();
                    self.text(&rest[..1 + i]);
                }
                None if rest.len() > MAX_BRACKET => {
                    self.input.clear();
                    self.text(&rest);
                }
                None => {
                    self.input = rest;
                    break;
                }
            }
        }
        std::mem::take(&mut self.out)
    }

    /// The end of the answer: what is left to send.
    pub fn finish(&mut self) -> Vec<Out> {
        let rest = std::mem::take(&mut self.input);
        self.text(&rest);
        if has_words(&self.cur) {
            self.end_sentence(self.cur.len());
        }
        if !self.lead.is_empty() && self.released {
            let numbers = std::mem::take(&mut self.lead);
            self.out.push(Out::Text(" ".into()));
            self.out.push(Out::Cite { sentence: self.last.clone(), numbers });
        }
        std::mem::take(&mut self.out)
    }

    fn text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        self.cur.push_str(t);
        while let Some(end) = sentence_end(&self.cur) {
            self.end_sentence(end);
        }
        if !self.released {
            // Whole words only: the last one may go on in the next piece.
            let whole = self.cur.rfind(|c: char| !is_word_char(c)).unwrap_or(0);
            if words::adds(&self.cur[..whole], &self.question) == 0 {
                return;
            }
            self.released = true;
        }
        // Trailing spaces and punctuation wait: a citation may come before them.
        let end = self.cur.trim_end_matches(|c: char| c.is_whitespace() || matches!(c, '.' | '!' | '?')).len();
        self.send_cur(end);
    }

    /// Sends `cur[sent..end]`.
    fn send_cur(&mut self, end: usize) {
        if end > self.sent {
            let piece = self.cur[self.sent..end].to_string();
            self.send(&piece);
            self.sent = end;
        }
    }

    fn send(&mut self, text: &str) {
        let text = if self.started { text } else { text.trim_start() };
        if !text.is_empty() {
            self.started = true;
            self.out.push(Out::Text(text.to_string()));
        }
    }

    /// The sentence `cur[..end]` is complete.
    fn end_sentence(&mut self, end: usize) {
        let sentence = self.cur[..end].to_string();
        let rest = self.cur[end..].to_string();
        if !self.released && words::adds(&sentence, &self.question) == 0 {
            // A restatement: left out; its citations wait for the next sentence.
            self.dropped.push(sentence.trim().to_string());
            self.cur = rest;
            self.sent = 0;
            return;
        }
        self.released = true;
        let body = sentence.trim_end_matches(|c: char| c.is_whitespace() || matches!(c, '.' | '!' | '?')).len();
        self.send_cur(body);
        if !self.lead.is_empty() {
            let numbers = std::mem::take(&mut self.lead);
            self.out.push(Out::Text(" ".into()));
            self.out.push(Out::Cite { sentence: sentence.trim().to_string(), numbers });
        }
        self.send_cur(end);
        self.last = sentence.trim().to_string();
        self.sent = self.sent.saturating_sub(end);
        self.cur = rest;
    }

    /// A complete `[...]`.
    fn bracket(&mut self, inside: &str) {
        let parts: Vec<&str> = inside.split([',', ';']).map(str::trim).collect();
        if !parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
            self.text(&format!("[{inside}]"));
            return;
        }
        let mut numbers = Vec::new();
        for p in parts {
            match p.parse::<usize>().ok().filter(|&n| n >= 1 && n <= self.k) {
                Some(n) if !numbers.contains(&n) => numbers.push(n),
                Some(_) => {}
                None => {
                    self.unknown.push(p.to_string());
                    self.text(&format!("[{p}]"));
                }
            }
        }
        if numbers.is_empty() {
            return;
        }
        // After a sentence's final stop (`It is P-384. [1]`): that sentence has ended, and the
        // citation opens the next one (or, at the end of the answer, cites the last one).
        let stopped = self.cur.trim_end();
        let (end, ended) = (stopped.len(), stopped.ends_with(['.', '!', '?']) && has_words(stopped));
        if ended {
            self.end_sentence(end);
        }
        for n in numbers {
            if !self.lead.contains(&n) {
                self.lead.push(n);
            }
        }
        if !self.released || !has_words(&self.cur) {
            return; // cites the sentence that follows, or waits with its held sentence
        }
        // After the sentence's words: it cites what came before it, here.
        let end = self.cur.trim_end().len();
        self.send_cur(end);
        let numbers = std::mem::take(&mut self.lead);
        self.out.push(Out::Text(" ".into()));
        self.out.push(Out::Cite { sentence: self.cur.trim().to_string(), numbers });
        self.sent = self.cur.len();
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | '#' | '@' | ':' | '=')
}

fn has_words(s: &str) -> bool {
    s.chars().any(char::is_alphanumeric)
}

/// Where the first sentence of `s` ends (after its final punctuation or before a line
/// break), if it has ended: `.`, `!` or `?` followed by spaces and then anything but a
/// lowercase letter (so `e.g. this` goes on), or a line break after some words.
fn sentence_end(s: &str) -> Option<usize> {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    for (i, &(at, c)) in chars.iter().enumerate() {
        if c == '\n' {
            if has_words(&s[..at]) {
                return Some(at);
            }
            continue;
        }
        if !matches!(c, '.' | '!' | '?') || !has_words(&s[..at]) {
            continue;
        }
        let mut j = i + 1;
        while j < chars.len() && chars[j].1 == ' ' {
            j += 1;
        }
        if j == i + 1 || j == chars.len() {
            continue; // no space after it, or not yet known what follows
        }
        if !chars[j].1.is_lowercase() {
            return Some(at + c.len_utf8());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, then finishes; returns the outputs with each Cite shown as `{sentence|numbers}`.
    fn run(question: &str, k: usize, pieces: &[&str]) -> (String, Composer) {
        let mut c = Composer::new(question, k);
        let mut outs = Vec::new();
        for p in pieces {
            outs.extend(c.push(p));
        }
        outs.extend(c.finish());
        let shown = outs
            .into_iter()
            .map(|o| match o {
                Out::Text(t) => t,
                Out::Cite { sentence, numbers } => format!("{{{sentence}|{numbers:?}}}"),
            })
            .collect();
        (shown, c)
    }

    #[test]
    fn a_leading_citation_moves_to_the_end_of_its_sentence() {
        let q = "How do honey bees tell their hive mates where flowers are?";
        let pieces = ["[", "2", "] Honey bees", " use the waggle", " dance. It is a ", "figure-of-eight", " run."];
        let (shown, c) = run(q, 2, &pieces);
        assert_eq!(
            shown,
            "Honey bees use the waggle dance {Honey bees use the waggle dance.|[2]}. It is a figure-of-eight run."
        );
        assert!(c.released() && c.unknown.is_empty());
    }

    #[test]
    fn a_trailing_citation_stays_where_it_is_and_unknown_numbers_stay_as_written() {
        let q = "Which curve does the VCEK key use?";
        let (shown, c) = run(q, 3, &["The VCEK key is P-384 [3", "]. See also [7] and [note]."]);
        assert_eq!(shown, "The VCEK key is P-384 {The VCEK key is P-384|[3]}. See also [7] and [note].");
        assert_eq!(c.unknown, ["7"]);
        let (shown, _) = run(q, 3, &["It is P-384. [1]"]);
        assert_eq!(shown, "It is P-384. {It is P-384.|[1]}");
    }

    #[test]
    fn a_restated_question_is_left_out_and_its_citation_goes_to_the_next_sentence() {
        let q = "How do I run the tests?";
        let (shown, c) = run(q, 2, &["[1] To run the tests, you run", " the tests. Use bash scripts/test.sh."]);
        assert_eq!(shown, "Use bash scripts/test.sh {Use bash scripts/test.sh.|[1]}.");
        assert!(c.released());
        assert_eq!(c.dropped().0, "To run the tests, you run the tests.");
        // Nothing but the restatement: nothing is sent, and the caller learns it.
        let (shown, c) = run(q, 2, &["[2] You can run the tests", " by running the tests."]);
        assert_eq!(shown, "");
        assert!(!c.released());
        assert_eq!(c.dropped(), ("You can run the tests by running the tests.".to_string(), vec![2]));
    }

    #[test]
    fn text_streams_once_a_word_adds_to_the_question() {
        let q = "Which Kubernetes version does the control plane use?";
        let mut c = Composer::new(q, 1);
        assert!(c.push("[1] The control plane uses ").is_empty(), "held: nothing added yet");
        let out = c.push("Kubernetes 1.37 built from ");
        assert_eq!(out, [Out::Text("The control plane uses Kubernetes 1.37 built from".into())]);
        assert_eq!(c.push("source"), [Out::Text(" source".into())]);
        let end = c.finish();
        assert_eq!(
            end,
            [
                Out::Text(" ".into()),
                Out::Cite {
                    sentence: "The control plane uses Kubernetes 1.37 built from source".into(),
                    numbers: vec![1]
                },
            ]
        );
    }

    #[test]
    fn sentences_end_at_a_capital_after_the_stop_or_a_line_break() {
        assert_eq!(sentence_end("It is e.g. this. Next"), Some(16));
        assert_eq!(sentence_end("Version v1.2 is"), None);
        assert_eq!(sentence_end("Ends here. "), None, "what follows is not known yet");
        assert_eq!(sentence_end("A list:\n- item"), Some(7));
        assert_eq!(sentence_end("\nLeading break"), None);
    }
}
