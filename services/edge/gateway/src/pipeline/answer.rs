//! The answer stage of a Query: the generator's stream through the [`Composer`], each
//! citation checked against the passages before it is sent, and an extractive answer when
//! the generator only restated the question.
//!
//! **Citations that hold.** A citation is checked when its sentence is complete: the embedder
//! embeds the sentence, and each passage the generator was shown supports it by the cosine
//! of its closest unit (the units the focus embedded beside the question,
//! [`crate::focus`]). A cited passage whose support is within [`CITE_MARGIN`] of the best
//! passage's keeps its citation; one further behind is replaced by the best passage
//! ([`recite`]). The small generators copy a passage's sentence and put another passage's
//! number before it (an answer about the waggle dance, whose sentence is in `bees.txt#0`,
//! cited as `[tea.md#0]`); a copied or paraphrased sentence is far closer to the unit it
//! came from than to any other passage, so the check finds the passage that says it.
//!
//! **Answers that answer.** When no sentence of the answer adds a word to the question
//! ([`super::words`]), the answer is the shown unit closest to the question that adds one,
//! cited to its passage ([`Evidence::extract`]): a sentence of the passages, not a
//! restatement.

use std::time::Instant;

use api::v1::{FinishReason, GenerateRequest, Usage};
use tokio::sync::mpsc;

use super::{
    Pipeline, QueryEvent, Timings,
    compose::{Composer, Out},
    words,
};
use crate::{error::Result, focus, prompt};

/// A cited passage keeps its citation while its closest unit is at most this much less
/// similar (cosine) to the sentence than the best passage's closest unit: two passages that
/// say the same thing may both be cited.
pub const CITE_MARGIN: f32 = 0.1;

/// How much a unit's share of the question's terms ([`words::overlap`]) adds to its cosine
/// to the question. Chosen offline on `eval/rag/questions.jsonl` (the units of the 8
/// candidates of each question, no generation): with 0.15 the excerpt shown first held the
/// reference fact for 18 questions instead of 16, and the four shown excerpts for as many
/// (27); 0.1 and 0.2 gave 17. Small enough that a term-rich unit the embedder finds far from the
/// question does not win.
pub const OVERLAP_WEIGHT: f32 = 0.15;

/// Adds each unit's weighted overlap with the question's terms to its score; the overlap is
/// weighed among all the units of `passages`.
pub fn add_overlap(question: &str, passages: &mut [Vec<Unit>]) {
    let texts: Vec<&str> = passages.iter().flatten().map(|u| u.text.as_str()).collect();
    let overlap = words::overlap(question, &texts);
    for (unit, o) in passages.iter_mut().flatten().zip(overlap) {
        unit.score += OVERLAP_WEIGHT * o;
    }
}

/// One unit of a passage: its text, its score against the question (the cosine of their
/// embeddings plus [`OVERLAP_WEIGHT`] times their overlap of terms) and its embedding.
#[derive(Clone, Debug)]
pub struct Unit {
    pub text: String,
    pub score: f32,
    pub vector: Vec<f32>,
}

/// The units of the passages the generator was shown, in the prompt's order: what an
/// answer's sentences are checked against.
#[derive(Clone, Debug, Default)]
pub struct Evidence {
    pub passages: Vec<Vec<Unit>>,
}

impl Evidence {
    /// How well each of `k` passages supports a sentence with embedding `sentence`: the
    /// cosine of its closest unit (`-inf` for a passage with no unit embedded).
    pub fn support(&self, sentence: &[f32], k: usize) -> Vec<f32> {
        (0..k)
            .map(|p| {
                self.passages.get(p).map_or(f32::NEG_INFINITY, |units| {
                    units.iter().map(|u| models::ops::cosine(sentence, &u.vector)).fold(f32::NEG_INFINITY, f32::max)
                })
            })
            .collect()
    }

    /// The unit to answer `question` with when the generator did not: the highest-scoring
    /// unit that adds a word to the question and does not quote it, with its passage's index.
    pub fn extract(&self, question: &str) -> Option<(usize, &str)> {
        self.passages
            .iter()
            .enumerate()
            .flat_map(|(p, units)| units.iter().map(move |u| (p, u)))
            .filter(|(_, u)| words::adds(&u.text, question) > 0 && !focus::quotes(&u.text, question))
            .max_by(|a, b| a.1.score.total_cmp(&b.1.score).then(b.0.cmp(&a.0)))
            .map(|(p, u)| (p, u.text.as_str()))
    }
}

/// The passages (numbers from 1) a sentence should cite, given the ones it cites and each
/// passage's `support` of it: a cited passage within [`CITE_MARGIN`] of the best stays, one
/// further behind is replaced by the best; and how many were replaced. Without any support
/// known, the citations stay.
pub fn recite(numbers: &[usize], support: &[f32]) -> (Vec<usize>, usize) {
    let best = support.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)));
    let Some((best, &top)) = best.filter(|(_, s)| s.is_finite()) else {
        return (numbers.to_vec(), 0);
    };
    let mut out: Vec<usize> = Vec::with_capacity(numbers.len());
    let mut replaced = 0;
    for &n in numbers {
        let s = support.get(n.wrapping_sub(1)).copied().unwrap_or(f32::NEG_INFINITY);
        let keep = if s >= top - CITE_MARGIN { n } else { best + 1 };
        replaced += usize::from(keep != n);
        if !out.contains(&keep) {
            out.push(keep);
        }
    }
    (out, replaced)
}

/// What the answer stage needs from the Query.
pub(super) struct Answering<'a> {
    pub tx: &'a mpsc::Sender<Result<QueryEvent>>,
    pub question: &'a str,
    /// The shown passages' ids, numbered from 1 in the prompt.
    pub ids: &'a [String],
    pub evidence: &'a Evidence,
    pub arrived: Instant,
}

/// What has been sent of the answer.
#[derive(Default)]
struct Sent {
    text: String,
    first_token: Option<std::time::Duration>,
    recited: usize,
    gone: bool,
}

impl Pipeline {
    /// Generates the answer and streams it, checked, then its usage, citations and timings.
    pub(super) async fn answer(&self, req: GenerateRequest, a: Answering<'_>, mut t: Timings) -> Result<()> {
        let start = Instant::now();
        let (routed, first, mut stream) = self.generate(req).await?;
        let mut composer = Composer::new(a.question, a.ids.len());
        let mut sent = Sent::default();
        let (mut usage, mut cut) = (Usage::default(), false);
        let mut next = first;
        while let Some(msg) = next {
            self.send_all(composer.push(&msg.text), &a, &mut sent).await?;
            if sent.gone {
                return Ok(()); // dropping the stream cancels the generation
            }
            if msg.finish_reason != FinishReason::Unspecified as i32 {
                usage = msg.usage.unwrap_or_default();
                cut = msg.finish_reason == FinishReason::Length as i32;
            }
            next = match stream.message().await {
                Ok(m) => m,
                Err(status) => return Err(routed.broken(status)),
            };
        }
        let mut rest = composer.finish();
        let extractive = !composer.released();
        if extractive {
            rest = match a.evidence.extract(a.question).and_then(|(p, unit)| Some((a.ids.get(p)?, unit))) {
                Some((id, unit)) => vec![Out::Text(unit.to_string()), Out::Text(format!(" [{id}]"))],
                // Nothing better to say: what the generator wrote.
                None => {
                    let (text, numbers) = composer.dropped();
                    let mut outs = vec![Out::Text(text.clone())];
                    if !numbers.is_empty() {
                        outs.extend([Out::Text(" ".into()), Out::Cite { sentence: text, numbers }]);
                    }
                    outs
                }
            };
        }
        self.send_all(rest, &a, &mut sent).await?;
        if sent.gone {
            return Ok(());
        }
        t.generate = start.elapsed();
        t.first_token = sent.first_token.unwrap_or_else(|| a.arrived.elapsed());
        tracing::debug!(recited = sent.recited, extractive, "answer checked");
        let cited = prompt::parse_citations(&sent.text);
        let retrieved: Vec<&str> = a.ids.iter().map(String::as_str).collect();
        let (cited, mut unknown) = prompt::check(&cited, &retrieved);
        unknown.extend(composer.unknown.iter().map(|n| format!("[{n}]")));
        for e in [QueryEvent::Usage(usage, cut), QueryEvent::Citations { cited, unknown }, QueryEvent::Timings(t)] {
            if a.tx.send(Ok(e)).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    /// Sends `outs` in order, each citation checked; stops once the client is gone.
    async fn send_all(&self, outs: Vec<Out>, a: &Answering<'_>, sent: &mut Sent) -> Result<()> {
        for out in outs {
            if sent.gone {
                return Ok(());
            }
            let text = match out {
                Out::Text(text) => text,
                Out::Cite { sentence, numbers } => {
                    let numbers = if a.evidence.passages.is_empty() {
                        numbers
                    } else {
                        let (mut v, _) = self.embed(&[sentence], true).await?;
                        let support = a.evidence.support(&v.pop().unwrap_or_default(), a.ids.len());
                        let (numbers, replaced) = recite(&numbers, &support);
                        sent.recited += replaced;
                        numbers
                    };
                    let ids: Vec<&str> = numbers.iter().map(|&n| a.ids[n - 1].as_str()).collect();
                    format!("[{}]", ids.join(", "))
                }
            };
            if text.is_empty() {
                continue;
            }
            if sent.first_token.is_none() {
                sent.first_token = Some(a.arrived.elapsed());
            }
            sent.text.push_str(&text);
            sent.gone = a.tx.send(Ok(QueryEvent::Text(text))).await.is_err();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_citation_far_behind_the_best_passage_moves_to_it() {
        // The waggle-dance sentence cites passage 1 (tea, 0.05) while passage 2 (bees) says it.
        assert_eq!(recite(&[1], &[0.05, 0.93]), (vec![2], 1));
        // Within the margin, both may be cited; a repeat is sent once.
        assert_eq!(recite(&[1, 2], &[0.88, 0.93]), (vec![1, 2], 0));
        assert_eq!(recite(&[1, 3], &[0.2, 0.9, 0.1]), (vec![2], 2));
        // No support known (no units embedded): the citations stay.
        assert_eq!(recite(&[1], &[f32::NEG_INFINITY, f32::NEG_INFINITY]), (vec![1], 0));
    }

    #[test]
    fn support_is_the_closest_unit_and_the_extract_adds_to_the_question() {
        let unit = |text: &str, score: f32, vector: Vec<f32>| Unit { text: text.into(), score, vector };
        let evidence = Evidence {
            passages: vec![
                vec![unit("Tea comes from Camellia sinensis.", 0.2, vec![0.0, 1.0])],
                vec![
                    unit("How do I run the tests?", 0.99, vec![1.0, 0.0]),
                    unit("To run the tests, run bash scripts/test.sh.", 0.8, vec![0.6, 0.8]),
                ],
            ],
        };
        let s = evidence.support(&[1.0, 0.0], 3);
        assert!((s[0] - 0.0).abs() < 1e-6 && (s[1] - 1.0).abs() < 1e-6 && s[2].is_infinite(), "{s:?}");
        // The unit that quotes the question scores highest and is passed over.
        assert_eq!(
            evidence.extract("How do I run the tests?"),
            Some((1, "To run the tests, run bash scripts/test.sh."))
        );
        assert_eq!(Evidence::default().extract("anything?"), None);
    }

    #[test]
    fn a_unit_with_the_questions_terms_overtakes_a_neighbour_the_embedder_puts_first() {
        let unit = |text: &str, score: f32| Unit { text: text.into(), score, vector: Vec::new() };
        let q = "Which Kubernetes version does the control plane in the tests use?";
        let answer = "A real control plane, built at pinned versions (k8s.io/kubernetes v1.37.2).";
        // The cosines MiniLM gave these two sentences of docs/KUBERNETES.md.
        let mut passages = vec![
            vec![unit("There is no kubelet: kubelet.py plays the kubelet for the test namespace.", 0.539)],
            vec![unit(answer, 0.499)],
        ];
        add_overlap(q, &mut passages);
        let evidence = Evidence { passages };
        assert!((evidence.passages[1][0].score - (0.499 + 0.8 * OVERLAP_WEIGHT)).abs() < 1e-6);
        assert_eq!(evidence.extract(q), Some((1, answer)));
    }
}
