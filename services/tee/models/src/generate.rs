//! Text generation: admission, then prefill, then decode one token per step for any number
//! of sequences at once, with the KV cache, sampler and stop handling of every sequence kept
//! in the TEE.
//!
//! [`TextGenerator::admit`] is the one place a [`GenerateRequest`] is checked: against the
//! model (chat roles, an empty prompt, the vocabulary, the context window) and against the
//! bounds a service sets ([`GenerationLimits`]). It tokenizes the prompt and returns an
//! [`AdmittedRequest`], which only it can make and which is all [`TextGenerator::start`]
//! takes, so no unchecked request reaches prefill. A rule broken is a [`Refusal`].
//!
//! [`TextGenerator::start`] prefills admitted requests and samples their first token;
//! [`TextGenerator::step`] advances a set of running sequences by one token in one forward
//! pass (each sequence with its own mask), which is what continuous batching needs.
//! [`TextGenerator::generate`] does all three for one request, for in-process callers.

use std::{fmt, ops::RangeInclusive};

pub use crate::error::{Limit, Refusal};
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
    /// Token ids, completed as they are.
    Tokens(Vec<u32>),
}

/// A generation request as a caller states it; [`TextGenerator::admit`] checks it.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops before the first occurrence of any of these strings (empty ones
    /// are ignored).
    pub stop: Vec<String>,
    /// Generation stops once a run of this many words repeats one already in the output
    /// (degenerate repetition, [`repeated_run`]); the text ends with that repeat, since
    /// words are seen only after they were emitted. 0: off.
    pub stop_repeated_words: usize,
}

impl GenerateRequest {
    /// Greedy decoding of `prompt`, no stop strings.
    pub fn greedy(prompt: Prompt, max_tokens: usize) -> Self {
        GenerateRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            stop_repeated_words: 0,
        }
    }

    /// The rules that need no tokenizer, in the order [`TextGenerator::admit`] applies them.
    fn check(&self, limits: &GenerationLimits) -> Result<(), Refusal> {
        if let Prompt::Chat(messages) = &self.prompt {
            if messages.is_empty() {
                return Err(Refusal::NoMessages);
            }
            if let Some(index) =
                messages.iter().position(|m| !matches!(m.role.as_str(), "system" | "user" | "assistant"))
            {
                return Err(Refusal::UnknownRole { index });
            }
            if messages.iter().all(|m| m.content.trim().is_empty()) {
                return Err(Refusal::EmptyMessages);
            }
        }
        if self.max_tokens == 0 {
            return Err(Refusal::NoOutputTokens);
        }
        too_large(Limit::OutputTokens, self.max_tokens, limits.max_output_tokens)?;
        too_large(Limit::StopStrings, self.stop.len(), limits.max_stop_strings)?;
        if self.stop.iter().any(|s| s.len() > limits.max_stop_bytes) {
            return Err(Refusal::StopTooLong { limit: limits.max_stop_bytes });
        }
        self.sampling.validate()?;
        let words = &limits.stop_repeated_words;
        if self.stop_repeated_words != 0 && !words.contains(&self.stop_repeated_words) {
            return Err(Refusal::StopRepeatedWords {
                got: self.stop_repeated_words,
                min: *words.start(),
                max: *words.end(),
            });
        }
        Ok(())
    }
}

/// [`Refusal::TooLarge`] when `got` exceeds `limit`.
fn too_large(what: Limit, got: usize, limit: usize) -> Result<(), Refusal> {
    if got > limit { Err(Refusal::TooLarge { what, got, limit }) } else { Ok(()) }
}

/// The bounds a service puts on generation requests, on top of the model's own (its
/// context window, which [`TextGenerator::admit`] always enforces).
///
/// [`Default`] holds a service's defaults; [`GenerationLimits::unbounded`] sets none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationLimits {
    /// Most tokens one request may ask for (`max_tokens`).
    pub max_output_tokens: usize,
    /// Most stop strings per request.
    pub max_stop_strings: usize,
    /// Longest stop string, in bytes: every decode step searches the new text for each.
    pub max_stop_bytes: usize,
    /// Most prompt tokens; `None`: the model's context.
    pub max_prompt_tokens: Option<usize>,
    /// The run lengths `stop_repeated_words` may name besides 0 (off). Single words repeat
    /// all the time, so it should start at 2; its end bounds the work per step.
    pub stop_repeated_words: RangeInclusive<usize>,
}

impl Default for GenerationLimits {
    fn default() -> Self {
        GenerationLimits {
            max_output_tokens: 2048,
            max_stop_strings: 16,
            max_stop_bytes: 256,
            max_prompt_tokens: None,
            stop_repeated_words: 2..=64,
        }
    }
}

impl GenerationLimits {
    /// No bounds beyond the model's, for in-process callers ([`TextGenerator::generate`]);
    /// `stop_repeated_words` still starts at 2.
    pub fn unbounded() -> Self {
        GenerationLimits {
            max_output_tokens: usize::MAX,
            max_stop_strings: usize::MAX,
            max_stop_bytes: usize::MAX,
            max_prompt_tokens: None,
            stop_repeated_words: 2..=usize::MAX,
        }
    }
}

/// A request [`TextGenerator::admit`] accepted: its prompt as token ids, every rule met.
/// Only `admit` makes one (its fields are private), so only checked requests reach
/// [`TextGenerator::start`]. It is meant for the generator that admitted it (whose
/// tokenizer and context it was checked against).
#[derive(Clone)]
pub struct AdmittedRequest {
    tokens: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingParams,
    /// Without empty strings.
    stop: Vec<String>,
    stop_repeated_words: usize,
}

impl AdmittedRequest {
    /// The prompt's token ids (never empty).
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Most tokens to generate: at least 1, within the limits and the context.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
}

/// Counts, not contents: the prompt and stop strings stay out of logs.
impl fmt::Debug for AdmittedRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmittedRequest")
            .field("prompt_tokens", &self.tokens.len())
            .field("max_tokens", &self.max_tokens)
            .field("sampling", &self.sampling)
            .field("stop_strings", &self.stop.len())
            .field("stop_repeated_words", &self.stop_repeated_words)
            .finish()
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
    /// Checks `req` against the model and `limits` and tokenizes its prompt: the one place
    /// a generation request is validated. The rules, in this order (the first one broken
    /// is the [`Refusal`]; the cheap ones come before tokenizing):
    ///
    /// 1. a chat prompt has messages, each with role `system`, `user` or `assistant`, not
    ///    all of them blank;
    /// 2. `max_tokens` is at least 1 and at most `limits.max_output_tokens`;
    /// 3. at most `limits.max_stop_strings` stop strings, none over `limits.max_stop_bytes`;
    /// 4. the sampling parameters are within range ([`SamplingParams::validate`]);
    /// 5. `stop_repeated_words` is 0 or within `limits.stop_repeated_words`;
    /// 6. the prompt has tokens, all in the vocabulary, no more than
    ///    `limits.max_prompt_tokens` nor the context;
    /// 7. the prompt and `max_tokens` fit the context together.
    ///
    /// A prompt the tokenizer or chat template cannot handle is [`ModelError::Tokenizer`]
    /// or [`ModelError::Template`].
    pub fn admit(&self, req: GenerateRequest, limits: &GenerationLimits) -> Result<AdmittedRequest> {
        req.check(limits)?;
        let tokens = self.tokenize(req.prompt)?;
        self.check_prompt(&tokens, req.max_tokens, limits)?;
        Ok(AdmittedRequest {
            tokens,
            max_tokens: req.max_tokens,
            sampling: req.sampling,
            stop: req.stop.into_iter().filter(|s| !s.is_empty()).collect(),
            stop_repeated_words: req.stop_repeated_words,
        })
    }

    /// Token ids of a prompt (rules 6 and 7 of [`TextGenerator::admit`] come after).
    fn tokenize(&self, prompt: Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Tokens(t) => Ok(t),
            Prompt::Raw(text) => self.tokenizer.encode(&text, true),
            Prompt::Chat(messages) => {
                let text = self.tokenizer.apply_chat_template(&messages, true)?;
                // The template already holds every special token the model expects.
                self.tokenizer.encode(&text, false)
            }
        }
    }

    /// The rules on the prompt's tokens: 6 and 7 of [`TextGenerator::admit`].
    fn check_prompt(&self, tokens: &[u32], max_tokens: usize, limits: &GenerationLimits) -> Result<(), Refusal> {
        if tokens.is_empty() {
            return Err(Refusal::EmptyPrompt);
        }
        if tokens.iter().any(|&t| t as usize >= self.decoder.cfg.vocab_size) {
            return Err(Refusal::UnknownToken);
        }
        let context = self.context_limit();
        too_large(Limit::PromptTokens, tokens.len(), limits.max_prompt_tokens.map_or(context, |m| m.min(context)))?;
        too_large(Limit::Context, tokens.len().saturating_add(max_tokens), context)
    }

    /// Context window in tokens (prompt plus output).
    pub fn context_limit(&self) -> usize {
        self.decoder.cfg.max_positions
    }

    fn new_sequence(&self, req: &AdmittedRequest) -> Sequence {
        Sequence {
            cache: self.decoder.new_cache(),
            sampler: Sampler::new(req.sampling.clone()),
            prompt_len: req.tokens.len(),
            history: req.tokens.clone(),
            generated: Vec::new(),
            pending: None,
            max_tokens: req.max_tokens,
            stop: req.stop.clone(),
            stop_repeated_words: req.stop_repeated_words,
            emitted: 0,
            text: String::new(),
            finish: None,
        }
    }

    /// Prefills one admitted request and samples its first token.
    pub fn start(&self, req: &AdmittedRequest) -> Result<(Sequence, Chunk)> {
        let mut out = self.start_batch(std::slice::from_ref(req))?;
        Ok(out.pop().expect("one request"))
    }

    /// Prefills several admitted requests in one forward pass.
    pub fn start_batch(&self, reqs: &[AdmittedRequest]) -> Result<Vec<(Sequence, Chunk)>> {
        let mut seqs: Vec<Sequence> = reqs.iter().map(|r| self.new_sequence(r)).collect();
        let tokens: Vec<&[u32]> = reqs.iter().map(|r| r.tokens.as_slice()).collect();
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
    /// returning false cancels the generation (and frees its KV cache). The request is
    /// admitted under [`GenerationLimits::unbounded`]: the model's rules only.
    pub fn generate(&self, req: &GenerateRequest, mut on_chunk: impl FnMut(&Chunk) -> bool) -> Result<Completion> {
        let req = self.admit(req.clone(), &GenerationLimits::unbounded())?;
        let (mut seq, first) = self.start(&req)?;
        if !on_chunk(&first) {
            return Err(ModelError::Cancelled);
        }
        while !seq.is_finished() {
            let chunk = self.step(&mut [&mut seq])?.pop().expect("one sequence");
            if !on_chunk(&chunk) {
                return Err(ModelError::Cancelled);
            }
        }
        Ok(seq.completion().expect("finished"))
    }

    /// Runs several requests together: one prefill pass, then batched decode steps. Each is
    /// admitted as by [`TextGenerator::generate`].
    pub fn generate_batch(&self, reqs: &[GenerateRequest]) -> Result<Vec<Completion>> {
        let limits = GenerationLimits::unbounded();
        let reqs = reqs.iter().map(|r| self.admit(r.clone(), &limits)).collect::<Result<Vec<_>>>()?;
        let mut seqs: Vec<Sequence> = self.start_batch(&reqs)?.into_iter().map(|(s, _)| s).collect();
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
    use std::sync::{Arc, OnceLock};

    use super::*;
    use crate::decoder::{DecoderConfig, qwen3::QWEN3};

    /// A word-level tokenizer over a few words (no BOS), with a chat template if
    /// `template`, and a random two-layer decoder with a 32-token context: enough to admit
    /// and start requests.
    fn build(template: bool) -> TextGenerator {
        let words = ["<unk>", "<eos>", "user", "system", "assistant", ":", "hello", "world", "one", "two"];
        let vocab: serde_json::Map<String, serde_json::Value> =
            words.iter().enumerate().map(|(i, w)| (w.to_string(), i.into())).collect();
        let special = |id: usize| {
            serde_json::json!({"id": id, "content": words[id], "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        };
        let tokenizer = serde_json::json!({
            "version": "1.0",
            "added_tokens": [special(0), special(1)],
            "pre_tokenizer": {"type": "Whitespace"},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
        });
        let mut config = serde_json::json!({"eos_token": "<eos>"});
        if template {
            config["chat_template"] = "{% for m in messages %}{{ m.role }} : {{ m.content }} {% endfor %}\
                                       {% if add_generation_prompt %}assistant :{% endif %}"
                .into();
        }
        let dir = std::env::temp_dir().join(format!("gelo-admit-{}-{template}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        let tokenizer = TextTokenizer::from_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let cfg = DecoderConfig {
            arch: &QWEN3,
            vocab_size: words.len(),
            hidden_size: 16,
            intermediate_size: 32,
            num_layers: 2,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_positions: 32,
            tie_embeddings: true,
            kv: crate::decoder::KvPrecision::F32,
        };
        let decoder = crate::random::decoder(cfg, Arc::new(protocol::SealedExecutor::new()), 7).unwrap();
        TextGenerator { decoder, tokenizer, identity: ModelIdentity([0; 32]) }
    }

    fn tiny() -> &'static TextGenerator {
        static TINY: OnceLock<TextGenerator> = OnceLock::new();
        TINY.get_or_init(|| build(true))
    }

    fn limits() -> GenerationLimits {
        GenerationLimits { max_output_tokens: 8, max_stop_strings: 2, max_prompt_tokens: Some(6), ..Default::default() }
    }

    fn raw(text: &str) -> GenerateRequest {
        GenerateRequest::greedy(Prompt::Raw(text.into()), 4)
    }

    fn refusal(req: GenerateRequest, limits: &GenerationLimits) -> Refusal {
        match tiny().admit(req, limits) {
            Err(ModelError::Refused(r)) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_request_within_every_rule_is_admitted_with_its_tokens_and_starts() {
        let g = tiny();
        let req = GenerateRequest { stop: vec![String::new(), "two".into()], ..raw("hello world one") };
        let admitted = g.admit(req, &limits()).unwrap();
        assert_eq!(admitted.prompt_tokens(), [6, 7, 8]);
        assert_eq!(admitted.max_tokens(), 4);
        assert_eq!(admitted.stop, ["two"], "empty stop strings are dropped");
        // A chat prompt is rendered with the template, then tokenized.
        let chat = GenerateRequest::greedy(Prompt::Chat(vec![ChatMessage::new("user", "hello")]), 4);
        assert_eq!(g.admit(chat, &limits()).unwrap().prompt_tokens(), [2, 5, 6, 4, 5]);
        // At every limit exactly: 6 prompt tokens, 8 output tokens, 2 stop strings of 256
        // bytes, 64 repeated words.
        let at_limits = GenerateRequest {
            max_tokens: 8,
            stop: vec!["x".repeat(256); 2],
            stop_repeated_words: 64,
            ..raw("one two one two one two")
        };
        assert_eq!(g.admit(at_limits, &limits()).unwrap().prompt_tokens().len(), 6);
        // Prompt and output fill the context exactly.
        let full = GenerateRequest { max_tokens: 26, ..raw("one two one two one two") };
        g.admit(full, &GenerationLimits { max_output_tokens: 26, ..limits() }).unwrap();
        let (seq, first) = g.start(&admitted).unwrap();
        assert_eq!(seq.prompt_tokens(), 3);
        assert_eq!(seq.generated_tokens(), first.tokens.len());
    }

    #[test]
    fn each_rule_refuses_with_its_own_error() {
        let chat = |messages: &[(&str, &str)]| {
            GenerateRequest::greedy(Prompt::Chat(messages.iter().map(|(r, c)| ChatMessage::new(r, c)).collect()), 4)
        };
        let sampling = |sampling| GenerateRequest { sampling, ..raw("hello") };
        let over = |what, got, limit| Refusal::TooLarge { what, got, limit };
        let cases = [
            (chat(&[]), Refusal::NoMessages),
            (chat(&[("user", "hello"), ("wizard", "hello")]), Refusal::UnknownRole { index: 1 }),
            (chat(&[("system", " "), ("user", "\n")]), Refusal::EmptyMessages),
            (GenerateRequest { max_tokens: 0, ..raw("hello") }, Refusal::NoOutputTokens),
            (GenerateRequest { max_tokens: 9, ..raw("hello") }, over(Limit::OutputTokens, 9, 8)),
            (GenerateRequest { stop: vec!["a".into(); 3], ..raw("hello") }, over(Limit::StopStrings, 3, 2)),
            (GenerateRequest { stop: vec!["x".repeat(257)], ..raw("hello") }, Refusal::StopTooLong { limit: 256 }),
            (
                sampling(SamplingParams { temperature: 5.5, ..Default::default() }),
                Refusal::Sampling { param: "temperature", range: "0..=5" },
            ),
            (
                sampling(SamplingParams { top_p: f32::NAN, ..Default::default() }),
                Refusal::Sampling { param: "top_p", range: "0..=1" },
            ),
            (
                sampling(SamplingParams { repetition_penalty: -1.0, ..Default::default() }),
                Refusal::Sampling { param: "repetition_penalty", range: "0..=10" },
            ),
            (
                GenerateRequest { stop_repeated_words: 1, ..raw("hello") },
                Refusal::StopRepeatedWords { got: 1, min: 2, max: 64 },
            ),
            (
                GenerateRequest { stop_repeated_words: 65, ..raw("hello") },
                Refusal::StopRepeatedWords { got: 65, min: 2, max: 64 },
            ),
            (raw(""), Refusal::EmptyPrompt),
            (GenerateRequest::greedy(Prompt::Tokens(vec![]), 4), Refusal::EmptyPrompt),
            (GenerateRequest::greedy(Prompt::Tokens(vec![6, 10]), 4), Refusal::UnknownToken),
            (raw("one two one two one two one"), over(Limit::PromptTokens, 7, 6)),
        ];
        for (req, want) in cases {
            let what = format!("{req:?}");
            assert_eq!(refusal(req, &limits()), want, "{what}");
        }
        // Without a prompt limit the context bounds the prompt, then prompt and output.
        let open = GenerationLimits { max_output_tokens: 64, ..Default::default() };
        let words = |n| vec!["one"; n].join(" ");
        assert_eq!(refusal(raw(&words(33)), &open), over(Limit::PromptTokens, 33, 32));
        let long = GenerateRequest { max_tokens: 23, ..raw(&words(10)) };
        assert_eq!(refusal(long, &open), over(Limit::Context, 33, 32));
        // The first rule broken is the one named.
        let both = GenerateRequest { max_tokens: 0, stop_repeated_words: 1, ..chat(&[("wizard", "hello")]) };
        assert_eq!(refusal(both, &limits()), Refusal::UnknownRole { index: 0 });
        // A prompt the tokenizer or template cannot handle is their error, not a refusal.
        let chat = GenerateRequest::greedy(Prompt::Chat(vec![ChatMessage::new("user", "hello")]), 4);
        assert!(matches!(build(false).admit(chat, &limits()), Err(ModelError::Template(_))));
    }

    #[test]
    fn refusals_read_as_clients_have_always_seen_them() {
        let cases = [
            (Refusal::NoMessages, "messages is empty (or set raw_prompt)"),
            (Refusal::UnknownRole { index: 2 }, "messages[2].role must be system, user or assistant"),
            (Refusal::EmptyMessages, "every message is empty"),
            (Refusal::StopTooLong { limit: 256 }, "a stop string is longer than 256 bytes"),
            (
                Refusal::StopRepeatedWords { got: 1, min: 2, max: 64 },
                "stop_repeated_words must be 0 (off) or 2 to 64, got 1",
            ),
            (Refusal::Sampling { param: "top_p", range: "0..=1" }, "invalid request: top_p must be within 0..=1"),
            (Refusal::EmptyPrompt, "the prompt is empty"),
            (Refusal::TooLarge { what: Limit::OutputTokens, got: 9, limit: 8 }, "max_tokens: 9 exceeds the limit of 8"),
            (
                Refusal::TooLarge { what: Limit::StopStrings, got: 3, limit: 2 },
                "stop strings: 3 exceeds the limit of 2",
            ),
            (
                Refusal::TooLarge { what: Limit::PromptTokens, got: 7, limit: 6 },
                "prompt tokens: 7 exceeds the limit of 6",
            ),
            (
                Refusal::TooLarge { what: Limit::Context, got: 33, limit: 32 },
                "prompt tokens + max_tokens: 33 exceeds the limit of 32",
            ),
        ];
        for (r, want) in cases {
            assert_eq!(ModelError::from(r).to_string(), want);
        }
    }

    #[test]
    fn generate_admits_under_the_models_rules_only() {
        let g = tiny();
        // Far over a service's limits, within the model's: served.
        let big = GenerateRequest { stop: vec!["z".repeat(300); 20], ..raw("hello world") };
        let done = g.generate(&GenerateRequest { max_tokens: 3, ..big }, |_| true).unwrap();
        assert_eq!(done.prompt_tokens, 2);
        let role = GenerateRequest::greedy(Prompt::Chat(vec![ChatMessage::new("wizard", "hello")]), 4);
        assert!(matches!(g.generate(&role, |_| true), Err(ModelError::Refused(Refusal::UnknownRole { index: 0 }))));
        let long = GenerateRequest { max_tokens: 31, ..raw("hello world") };
        assert!(matches!(
            g.generate_batch(&[raw("hello"), long]),
            Err(ModelError::Refused(Refusal::TooLarge { what: Limit::Context, got: 33, limit: 32 }))
        ));
    }

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
