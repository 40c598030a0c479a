//! The roles the services run: embedders, rerankers (and the generator in `generate`).

use crate::{
    bert::{Bert, Encoded},
    decoder::Decoder,
    error::{ModelError, Result},
    identity::ModelIdentity,
    ops,
    tokenizer::TextTokenizer,
};

/// One input after tokenization, as a batch carries it to the model (the pattern of
/// text-embeddings-inference's `Batch`): a service tokenizes each text once, checks its
/// limit on `counted`, and the model runs `tokens` without tokenizing again.
/// No `Debug`: the ids are the text.
#[derive(Clone)]
pub struct Tokenized {
    /// The model's input, cut by the model's own rule to the length the caller asked for.
    pub tokens: Encoded,
    /// Tokens the text made before the cut (special tokens included).
    pub counted: usize,
}

/// Texts in, unit-norm vectors out.
pub trait Embedder: Send + Sync {
    /// `text` as the model takes it, cut to at most `max` tokens (and never more than
    /// [`Embedder::max_tokens`]).
    fn tokenize(&self, text: &str, max: usize) -> Result<Tokenized>;
    /// One embedding per tokenized input, in order, one forward pass shared by all (each
    /// input with its own mask).
    fn embed_tokens(&self, inputs: &[Encoded]) -> Result<Vec<Vec<f32>>>;
    fn dim(&self) -> usize;
    /// Longest input in tokens; longer inputs are truncated.
    fn max_tokens(&self) -> usize;
    fn identity(&self) -> ModelIdentity;

    /// One embedding per text, each cut to [`Embedder::max_tokens`]; the texts are
    /// tokenized in parallel on the compute pool.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let inputs =
            tensor::pool::global().map(texts.len(), &|i| self.tokenize(texts[i], self.max_tokens()).map(|t| t.tokens));
        self.embed_tokens(&inputs.into_iter().collect::<Result<Vec<_>>>()?)
    }

    /// Tokens `text` becomes before truncation (special tokens included).
    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.tokenize(text, self.max_tokens())?.counted)
    }
    /// `text` as a query under `instruction`, for models trained with instructions.
    fn with_instruction(&self, instruction: &str, text: &str) -> Result<String> {
        let _ = (instruction, text);
        Err(ModelError::InvalidRequest("this embedding model takes no instruction".into()))
    }
}

/// Scores documents against a query (higher is more relevant), in document order.
pub trait Reranker: Send + Sync {
    /// A (query, document) pair as the model takes it, cut to at most `max` tokens (and
    /// never more than [`Reranker::max_tokens`]).
    fn tokenize_pair(&self, query: &str, document: &str, max: usize) -> Result<Tokenized>;
    /// Relevance of each tokenized pair, all in one forward pass (each with its own mask):
    /// pairs of several requests can share a batch.
    fn score_tokens(&self, inputs: &[Encoded]) -> Result<Vec<f32>>;
    fn max_tokens(&self) -> usize;
    fn identity(&self) -> ModelIdentity;

    /// Relevance of each (query, document) pair, each cut to [`Reranker::max_tokens`].
    fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        let inputs = pairs
            .iter()
            .map(|(q, d)| Ok(self.tokenize_pair(q, d, self.max_tokens())?.tokens))
            .collect::<Result<Vec<_>>>()?;
        self.score_tokens(&inputs)
    }

    fn score(&self, query: &str, documents: &[&str]) -> Result<Vec<f32>> {
        let pairs: Vec<(&str, &str)> = documents.iter().map(|d| (query, *d)).collect();
        self.score_pairs(&pairs)
    }

    /// Tokens a (query, document) pair becomes before truncation.
    fn count_tokens(&self, query: &str, document: &str) -> Result<usize> {
        Ok(self.tokenize_pair(query, document, self.max_tokens())?.counted)
    }
}

/// How a BERT embedder pools token states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    Cls,
}

/// Sentence-transformers-style BERT embedder.
pub struct BertEmbedder {
    pub bert: Bert,
    pub tokenizer: TextTokenizer,
    pub pooling: Pooling,
    pub max_len: usize,
    pub identity: ModelIdentity,
}

impl Embedder for BertEmbedder {
    fn tokenize(&self, text: &str, max: usize) -> Result<Tokenized> {
        let mut ids = self.tokenizer.encode(text, true)?;
        let counted = ids.len();
        let max = max.clamp(1, self.max_len);
        if ids.len() > max {
            // What the tokenizer's own truncation does for one sequence: cut the text
            // tokens, keep the closing [SEP].
            let last = *ids.last().expect("non-empty");
            ids.truncate(max - 1);
            ids.push(last);
        }
        Ok(Tokenized { tokens: Encoded { types: vec![0; ids.len()], ids }, counted })
    }

    fn embed_tokens(&self, inputs: &[Encoded]) -> Result<Vec<Vec<f32>>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let hidden = self.bert.forward(inputs)?;
        Ok(hidden
            .iter()
            .map(|h| {
                let mut v = match self.pooling {
                    Pooling::Cls => h.row(0).to_vec(),
                    Pooling::Mean => {
                        let mut v = vec![0.0f64; h.cols()];
                        for r in 0..h.rows() {
                            v.iter_mut().zip(h.row(r)).for_each(|(a, &b)| *a += b as f64);
                        }
                        v.iter().map(|&a| (a / h.rows() as f64) as f32).collect()
                    }
                };
                ops::l2_normalize(&mut v);
                v
            })
            .collect())
    }

    fn dim(&self) -> usize {
        self.bert.hidden_size()
    }

    fn max_tokens(&self) -> usize {
        self.max_len
    }

    fn identity(&self) -> ModelIdentity {
        self.identity
    }
}

/// Decoder LLM embedder (Qwen3-Embedding): last-token pooling of the final hidden state,
/// queries prefixed with an instruction.
pub struct DecoderEmbedder {
    pub decoder: Decoder,
    pub tokenizer: TextTokenizer,
    pub max_len: usize,
    /// `Instruct: {instruction}\nQuery:` is prepended when set.
    pub instruction: Option<String>,
    pub identity: ModelIdentity,
}

/// Qwen3-Embedding's query format.
pub fn instructed_query(instruction: &str, text: &str) -> String {
    format!("Instruct: {instruction}\nQuery:{text}")
}

impl DecoderEmbedder {
    /// The text as the model sees it (Qwen3-Embedding's query format).
    pub fn format(&self, text: &str) -> String {
        match &self.instruction {
            Some(i) => instructed_query(i, text),
            None => text.to_string(),
        }
    }
}

impl Embedder for DecoderEmbedder {
    fn tokenize(&self, text: &str, max: usize) -> Result<Tokenized> {
        let mut ids = self.tokenizer.encode(&self.format(text), true)?;
        let counted = ids.len();
        let max = max.clamp(1, self.max_len);
        if ids.len() > max {
            // Keep the end: the last token is what gets pooled.
            ids.drain(..ids.len() - max);
        }
        Ok(Tokenized { tokens: Encoded { ids, types: Vec::new() }, counted })
    }

    fn embed_tokens(&self, inputs: &[Encoded]) -> Result<Vec<Vec<f32>>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        if inputs.iter().any(|t| t.ids.is_empty()) {
            return Err(ModelError::InvalidRequest("empty text".into()));
        }
        let mut caches: Vec<_> = inputs.iter().map(|_| self.decoder.new_cache()).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let slices: Vec<&[u32]> = inputs.iter().map(|t| t.ids.as_slice()).collect();
        let last = self.decoder.forward(&mut refs, &slices)?;
        Ok((0..last.rows())
            .map(|r| {
                let mut v = last.row(r).to_vec();
                ops::l2_normalize(&mut v);
                v
            })
            .collect())
    }

    fn dim(&self) -> usize {
        self.decoder.cfg.hidden_size
    }

    fn max_tokens(&self) -> usize {
        self.max_len
    }

    fn identity(&self) -> ModelIdentity {
        self.identity
    }

    fn with_instruction(&self, instruction: &str, text: &str) -> Result<String> {
        Ok(instructed_query(instruction, text))
    }
}

/// BERT cross-encoder: `[CLS] query [SEP] document [SEP]` → classifier logit.
pub struct CrossEncoder {
    pub bert: Bert,
    pub tokenizer: TextTokenizer,
    pub max_len: usize,
    pub identity: ModelIdentity,
}

impl Reranker for CrossEncoder {
    fn tokenize_pair(&self, query: &str, document: &str, max: usize) -> Result<Tokenized> {
        let (ids, types, counted) = self.tokenizer.encode_pair_within(query, document, max.min(self.max_len))?;
        Ok(Tokenized { tokens: Encoded { ids, types }, counted })
    }

    fn score_tokens(&self, inputs: &[Encoded]) -> Result<Vec<f32>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let logits = self.bert.classify(inputs)?;
        // One label: the logit itself (monotone in relevance); several: P(last label).
        Ok(logits
            .into_iter()
            .map(|l| {
                if l.len() == 1 {
                    l[0]
                } else {
                    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let z: f32 = l.iter().map(|v| (v - m).exp()).sum();
                    (l[l.len() - 1] - m).exp() / z
                }
            })
            .collect())
    }

    fn max_tokens(&self) -> usize {
        self.max_len
    }

    fn identity(&self) -> ModelIdentity {
        self.identity
    }
}

/// LLM yes/no reranker in Qwen3-Reranker's prompt format: the score is
/// `P(yes) / (P(yes) + P(no))` for the next token after the judgement prompt.
pub struct LlmReranker {
    pub decoder: Decoder,
    pub tokenizer: TextTokenizer,
    pub head: tensor::WeightId,
    pub instruction: String,
    pub max_len: usize,
    pub identity: ModelIdentity,
}

pub const RERANK_INSTRUCTION: &str = "Given a web search query, retrieve relevant passages that answer the query";

impl LlmReranker {
    /// The judgement prompt for one pair.
    pub fn prompt(&self, query: &str, document: &str) -> String {
        format!(
            "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. \
             Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n\
             <Instruct>: {}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            self.instruction
        )
    }
}

impl Reranker for LlmReranker {
    fn tokenize_pair(&self, query: &str, document: &str, max: usize) -> Result<Tokenized> {
        let mut ids = self.tokenizer.encode(&self.prompt(query, document), false)?;
        let counted = ids.len();
        let max = max.min(self.max_len);
        if ids.len() > max {
            // Cut the document's end, keep the closing of the prompt.
            let tail = self.tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", false)?;
            ids.truncate(max.saturating_sub(tail.len()));
            ids.extend(tail);
        }
        Ok(Tokenized { tokens: Encoded { ids, types: Vec::new() }, counted })
    }

    fn score_tokens(&self, inputs: &[Encoded]) -> Result<Vec<f32>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let mut caches: Vec<_> = inputs.iter().map(|_| self.decoder.new_cache()).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let slices: Vec<&[u32]> = inputs.iter().map(|t| t.ids.as_slice()).collect();
        let last = self.decoder.forward(&mut refs, &slices)?;
        let logits = self.decoder.head_logits(&last, &self.head)?;
        // Head columns are [no, yes].
        Ok((0..logits.rows())
            .map(|r| {
                let (no, yes) = (logits.get(r, 0), logits.get(r, 1));
                let m = no.max(yes);
                let (en, ey) = ((no - m).exp(), (yes - m).exp());
                ey / (en + ey)
            })
            .collect())
    }

    fn max_tokens(&self) -> usize {
        self.max_len
    }

    fn identity(&self) -> ModelIdentity {
        self.identity
    }
}
