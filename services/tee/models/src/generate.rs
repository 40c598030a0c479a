//! Text generation: prefill, then decode one token per step for any number of sequences at
//! once, with the KV cache, sampler and stop handling of every sequence kept in the TEE.
//!
//! [`TextGenerator::start`] prefills a request and samples its first token;
//! [`TextGenerator::step`] advances a set of running sequences by one token in one forward
//! pass (each sequence with its own mask), which is what continuous batching needs.

use crate::{
    decoder::{Decoder, KvCache},
    error::{ModelError, Result},
    identity::ModelIdentity,
    sampler::{Sampler, SamplingParams},
    tokenizer::{ChatMessage, TextTokenizer},
};

/// What to complete.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Rendered with the model's chat template, ending with the assistant's turn.
    Chat(Vec<ChatMessage>),
    /// Completed as is (the tokenizer adds BOS if the model wants one).
    Raw(String),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// Generation stops once a run of this many words repeats one already in the output
    /// (degenerate repetition, [`repeated_run`]); the text ends with that repeat, since
    /// words are seen only after they were emitted. 0: off.
    pub stop_repeated_words: usize,
}

impl GenerateRequest {
    pub fn greedy(prompt: Prompt, max_tokens: usize) -> Self {
        GenerateRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            stop_repeated_words: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
}

/// Text and tokens produced by one step of one sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    pub text: String,
    pub tokens: Vec<u32>,
    /// Set on the sequence's last chunk.
    pub finish: Option<FinishReason>,
}

/// A finished generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub text: String,
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub finish: FinishReason,
}

/// One running generation.
pub struct Sequence {
    cache: KvCache,
    sampler: Sampler,
    prompt_len: usize,
    /// Prompt and generated tokens (the repetition penalty's context).
    history: Vec<u32>,
    generated: Vec<u32>,
    /// Last sampled token, not yet fed to the model.
    pending: Option<u32>,
    max_tokens: usize,
    stop: Vec<String>,
    stop_repeated_words: usize,
    /// Bytes of the decoded text already emitted.
    emitted: usize,
    text: String,
    finish: Option<FinishReason>,
}

impl Sequence {
    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_len
    }

    pub fn generated_tokens(&self) -> usize {
        self.generated.len()
    }

    /// Bytes of KV cache this sequence holds in TEE memory.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    pub fn completion(&self) -> Option<Completion> {
        Some(Completion {
            text: self.text[..self.emitted].to_string(),
            tokens: self.generated.clone(),
            prompt_tokens: self.prompt_len,
            finish: self.finish?,
        })
    }
}

/// A decoder LLM with its tokenizer: the generator role.
pub struct TextGenerator {
    pub decoder: Decoder,
    pub tokenizer: TextTokenizer,
    pub identity: ModelIdentity,
}

impl TextGenerator {
    /// Token ids of a prompt.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Tokens(t) => Ok(t.clone()),
            Prompt::Raw(text) => self.tokenizer.encode(text, true),
            Prompt::Chat(messages) => {
                for m in messages {
                    if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                        return Err(ModelError::InvalidRequest(format!("unknown chat role `{}`", m.role)));
                    }
                }
                let text = self.tokenizer.apply_chat_template(messages, true)?;
                // The template already holds every special token the model expects.
                self.tokenizer.encode(&text, false)
            }
        }
    }

    /// Context window in tokens (prompt plus output).
    pub fn context_limit(&self) -> usize {
        self.decoder.cfg.max_positions
    }

    fn new_sequence(&self, req: &GenerateRequest) -> Result<(Sequence, Vec<u32>)> {
        req.sampling.validate()?;
        if req.max_tokens == 0 {
            return Err(ModelError::InvalidRequest("max_tokens must be at least 1".into()));
        }
        let prompt = self.prompt_tokens(&req.prompt)?;
        if prompt.is_empty() {
            return Err(ModelError::InvalidRequest("empty prompt".into()));
        }
        let limit = self.context_limit();
        if prompt.len() + req.max_tokens > limit {
            return Err(ModelError::ContextTooLong { tokens: prompt.len() + req.max_tokens, limit });
        }
        let seq = Sequence {
            cache: self.decoder.new_cache(),
            sampler: Sampler::new(req.sampling.clone()),
            prompt_len: prompt.len(),
            history: prompt.clone(),
            generated: Vec::new(),
            pending: None,
            max_tokens: req.max_tokens,
            stop: req.stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
            stop_repeated_words: req.stop_repeated_words,
            emitted: 0,
            text: String::new(),
            finish: None,
        };
        Ok((seq, prompt))
    }

    /// Prefills one request and samples its first token.
    pub fn start(&self, req: &GenerateRequest) -> Result<(Sequence, Chunk)> {
        let mut out = self.start_batch(std::slice::from_ref(req))?;
        Ok(out.pop().expect("one request"))
    }

    /// Prefills several requests in one forward pass.
    pub fn start_batch(&self, reqs: &[GenerateRequest]) -> Result<Vec<(Sequence, Chunk)>> {
        let mut seqs = Vec::with_capacity(reqs.len());
        let mut prompts = Vec::with_capacity(reqs.len());
        for r in reqs {
            let (s, p) = self.new_sequence(r)?;
            seqs.push(s);
            prompts.push(p);
        }
        let tokens: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let logits = {
            let mut caches: Vec<&mut KvCache> = seqs.iter_mut().map(|s| &mut s.cache).collect();
            self.decoder.step(&mut caches, &tokens)?
        };
        let mut out = Vec::with_capacity(seqs.len());
        for (i, mut s) in seqs.into_iter().enumerate() {
            let chunk = self.advance(&mut s, &mut logits.row(i).to_vec())?;
            out.push((s, chunk));
        }
        Ok(out)
    }

    /// Advances every unfinished sequence by one token, in one forward pass.
    pub fn step(&self, seqs: &mut [&mut Sequence]) -> Result<Vec<Chunk>> {
        let active: Vec<usize> = (0..seqs.len()).filter(|&i| !seqs[i].is_finished()).collect();
        let mut chunks = vec![Chunk::default(); seqs.len()];
        if active.is_empty() {
            return Ok(chunks);
        }
        let feed: Vec<[u32; 1]> =
            active.iter().map(|&i| [seqs[i].pending.expect("running sequence has a token")]).collect();
        let tokens: Vec<&[u32]> = feed.iter().map(|t| t.as_slice()).collect();
        let logits = {
            let mut caches: Vec<&mut KvCache> = Vec::with_capacity(active.len());
            for (i, s) in seqs.iter_mut().enumerate() {
                if active.contains(&i) {
                    caches.push(&mut s.cache);
                }
            }
            self.decoder.step(&mut caches, &tokens)?
        };
        for (row, &i) in active.iter().enumerate() {
            chunks[i] = self.advance(seqs[i], &mut logits.row(row).to_vec())?;
        }
        Ok(chunks)
    }

    /// Samples the next token of `s` from `logits` and works out the text it adds.
    fn advance(&self, s: &mut Sequence, logits: &mut [f32]) -> Result<Chunk> {
        let token = s.sampler.sample(logits, &s.history);
        logits.iter_mut().for_each(|v| *v = 0.0);
        let mut chunk = Chunk::default();
        if self.tokenizer.eos.contains(&token) {
            s.pending = None;
            chunk.text = self.flush(s, true)?;
            s.finish = Some(FinishReason::Stop);
            chunk.finish = s.finish;
            return Ok(chunk);
        }
        s.generated.push(token);
        s.history.push(token);
        chunk.tokens.push(token);
        let at_limit = s.generated.len() >= s.max_tokens || s.cache.len() + 1 >= self.context_limit();
        chunk.text = self.flush(s, at_limit)?;
        if s.finish.is_some() {
            s.pending = None;
        } else if at_limit {
            s.finish = Some(FinishReason::Length);
            s.pending = None;
        } else {
            s.pending = Some(token);
        }
        chunk.finish = s.finish;
        Ok(chunk)
    }

    /// New text that can be emitted: decoded text past what was emitted, holding back an
    /// incomplete UTF-8 character and any suffix that could start a stop string (unless
    /// `last`). Finds stop strings and repeated runs of words and ends the sequence at the
    /// first (a repeat found after part of it was emitted ends the text where it stands).
    fn flush(&self, s: &mut Sequence, last: bool) -> Result<String> {
        s.text = self.tokenizer.decode(&s.generated, true)?;
        let search_from = s.emitted.saturating_sub(s.stop.iter().map(String::len).max().unwrap_or(0));
        let search_from = floor_char_boundary(&s.text, search_from);
        let hit =
            s.stop.iter().filter_map(|stop| s.text[search_from..].find(stop.as_str()).map(|p| search_from + p)).min();
        let repeat = match s.stop_repeated_words {
            0 => None,
            n => repeated_run(&s.text, n, last),
        };
        let hit = hit.into_iter().chain(repeat).min();
        if let Some(end) = hit {
            let end = end.max(s.emitted);
            let out = s.text[s.emitted..end].to_string();
            s.emitted = end;
            s.finish = Some(FinishReason::Stop);
            return Ok(out);
        }
        let mut end = s.text.len();
        if !last {
            if s.text.ends_with('\u{FFFD}') {
                end -= '\u{FFFD}'.len_utf8();
            }
            for stop in &s.stop {
                for k in (1..stop.len()).rev() {
                    if stop.is_char_boundary(k) && s.text[..end].ends_with(&stop[..k]) {
                        end = end.min(s.text.len() - k);
                        break;
                    }
                }
            }
        }
        let end = end.max(s.emitted);
        let out = s.text[s.emitted..end].to_string();
        s.emitted = end;
        Ok(out)
    }

    /// Runs one request to completion, calling `on_chunk` as text arrives; `on_chunk`
    /// returning false cancels the generation (and frees its KV cache).
    pub fn generate(&self, req: &GenerateRequest, mut on_chunk: impl FnMut(&Chunk) -> bool) -> Result<Completion> {
        let (mut seq, first) = self.start(req)?;
        if !on_chunk(&first) {
            return Err(ModelError::InvalidRequest("cancelled".into()));
        }
        while !seq.is_finished() {
            let chunk = self.step(&mut [&mut seq])?.pop().expect("one sequence");
            if !on_chunk(&chunk) {
                return Err(ModelError::InvalidRequest("cancelled".into()));
            }
        }
        Ok(seq.completion().expect("finished"))
    }

    /// Runs several requests together: one prefill pass, then batched decode steps.
    pub fn generate_batch(&self, reqs: &[GenerateRequest]) -> Result<Vec<Completion>> {
        let mut seqs: Vec<Sequence> = self.start_batch(reqs)?.into_iter().map(|(s, _)| s).collect();
        while seqs.iter().any(|s| !s.is_finished()) {
            let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
            self.step(&mut refs)?;
        }
        Ok(seqs.iter().map(|s| s.completion().expect("finished")).collect())
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Where `text` starts repeating itself: the byte offset of the first run of `n` words
/// (split at whitespace) that already occurred earlier in `text`, or `None`. The last word
/// counts only when `last` or when whitespace follows it (it may still be growing).
pub fn repeated_run(text: &str, n: usize, last: bool) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let mut words: Vec<&str> = text.split_whitespace().collect();
    if !last && !text.ends_with(char::is_whitespace) {
        words.pop();
    }
    // Runs are slices of `words`: no allocation per run (this runs at every decoded token).
    let mut seen = std::collections::HashSet::with_capacity(words.len());
    words.windows(n).find(|run| !seen.insert(*run)).map(|run| run[0].as_ptr() as usize - text.as_ptr() as usize)
}

#[cfg(test)]
mod tests {
    use super::repeated_run;

    #[test]
    fn a_repeated_run_of_words_is_found_where_it_starts_again() {
        let t = "The policy's root is not valid; the root is not valid; the root is";
        // "root is not valid;" comes round again at the second "root".
        assert_eq!(
            repeated_run(t, 4, true),
            Some(t.find("root is not valid; the root").unwrap() + "root is not valid; the ".len())
        );
        assert_eq!(repeated_run(t, 8, true), None, "an eight-word run has not come round yet");
        assert_eq!(repeated_run("a b c a b c", 3, true), Some(6));
        // The last word may still grow: it counts only at the end or before whitespace.
        assert_eq!(repeated_run("a b c a b c", 3, false), None);
        assert_eq!(repeated_run("a b c a b c ", 3, false), Some(6));
        assert_eq!(repeated_run("a b c a b c", 0, true), None);
        assert_eq!(repeated_run("a b c d", 2, true), None);
    }
}
