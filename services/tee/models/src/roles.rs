//! The roles the services run: embedders, rerankers (and the generator in `generate`).

use crate::{
    bert::{Bert, Encoded},
    decoder::Decoder,
    error::{ModelError, Result},
    identity::ModelIdentity,
    ops,
    tokenizer::TextTokenizer,
};

/// Texts in, unit-norm vectors out.
pub trait Embedder: Send + Sync {
    /// One embedding per text, in order, each forward pass shared by all texts (each text
    /// with its own mask).
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
    fn dim(&self) -> usize;
    /// Longest input in tokens; longer inputs are truncated.
    fn max_tokens(&self) -> usize;
    /// Tokens `text` becomes before truncation (special tokens included).
    fn count_tokens(&self, text: &str) -> Result<usize>;
    fn identity(&self) -> ModelIdentity;
    /// `text` as a query under `instruction`, for models trained with instructions.
    fn with_instruction(&self, instruction: &str, text: &str) -> Result<String> {
        let _ = (instruction, text);
        Err(ModelError::InvalidRequest("this embedding model takes no instruction".into()))
    }
}

/// Scores documents against a query (higher is more relevant), in document order.
pub trait Reranker: Send + Sync {
    /// Relevance of each (query, document) pair, all pairs in one forward pass (each with
    /// its own mask): pairs of several requests can share a batch.
    fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>>;

    fn score(&self, query: &str, documents: &[&str]) -> Result<Vec<f32>> {
        let pairs: Vec<(&str, &str)> = documents.iter().map(|d| (query, *d)).collect();
        self.score_pairs(&pairs)
    }

    /// Tokens a (query, document) pair becomes before truncation.
    fn count_tokens(&self, query: &str, document: &str) -> Result<usize>;
    fn max_tokens(&self) -> usize;
    fn identity(&self) -> ModelIdentity;
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

impl BertEmbedder {
    fn encode(&self, text: &str) -> Result<Encoded> {
        let mut ids = self.tokenizer.encode(text, true)?;
        if ids.len() > self.max_len {
            // What the tokenizer's own truncation does for one sequence: cut the text
            // tokens, keep the closing [SEP].
            let last = *ids.last().expect("non-empty");
            ids.truncate(self.max_len - 1);
            ids.push(last);
        }
        Ok(Encoded { types: vec![0; ids.len()], ids })
    }
}

impl Embedder for BertEmbedder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let seqs = texts.iter().map(|t| self.encode(t)).collect::<Result<Vec<_>>>()?;
        let hidden = self.bert.forward(&seqs)?;
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

    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.tokenizer.encode(text, true)?.len())
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

    fn tokens(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.tokenizer.encode(&self.format(text), true)?;
        if ids.len() > self.max_len {
            // Keep the end: the last token is what gets pooled.
            ids.drain(..ids.len() - self.max_len);
        }
        Ok(ids)
    }
}

impl Embedder for DecoderEmbedder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let toks = texts.iter().map(|t| self.tokens(t)).collect::<Result<Vec<_>>>()?;
        if toks.iter().any(Vec::is_empty) {
            return Err(ModelError::InvalidRequest("empty text".into()));
        }
        let mut caches: Vec<_> = toks.iter().map(|_| self.decoder.new_cache()).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let slices: Vec<&[u32]> = toks.iter().map(Vec::as_slice).collect();
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

    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.tokenizer.encode(&self.format(text), true)?.len())
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
    fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let seqs = pairs
            .iter()
            .map(|(q, d)| {
                let (ids, types) = self.tokenizer.encode_pair(q, d)?;
                Ok(Encoded { ids, types })
            })
            .collect::<Result<Vec<_>>>()?;
        let logits = self.bert.classify(&seqs)?;
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

    fn count_tokens(&self, query: &str, document: &str) -> Result<usize> {
        Ok(self.tokenizer.encode_pair(query, document)?.0.len())
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
    fn score_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<f32>> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let toks = pairs
            .iter()
            .map(|(q, d)| {
                let mut ids = self.tokenizer.encode(&self.prompt(q, d), false)?;
                if ids.len() > self.max_len {
                    // Cut the document's end, keep the closing of the prompt.
                    let tail =
                        self.tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", false)?;
                    ids.truncate(self.max_len - tail.len());
                    ids.extend(tail);
                }
                Ok(ids)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut caches: Vec<_> = toks.iter().map(|_| self.decoder.new_cache()).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let slices: Vec<&[u32]> = toks.iter().map(Vec::as_slice).collect();
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

    fn count_tokens(&self, query: &str, document: &str) -> Result<usize> {
        Ok(self.tokenizer.encode(&self.prompt(query, document), false)?.len())
    }

    fn identity(&self) -> ModelIdentity {
        self.identity
    }
}
