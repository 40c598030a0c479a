//! Documents into passages, counted in the embedder's own tokens.
//!
//! The gateway loads only the embedder model's tokenizer (`tokenizer.json` in a model folder,
//! or a GGUF file's metadata), so that "at most N tokens" means what the embedder will see.
//! Two modes (`gelo.v1.Chunking`):
//! - tokens: windows of `chunk_tokens` tokens sharing `overlap` tokens (`store::chunk_text`);
//!   each passage is embedded as `"<title> <passage>"`, and the window shrinks by the title's
//!   tokens so that the pair still fits the embedder's maximum length. A markdown text (one
//!   with a `#` heading outside code) is cut at its headings first, and each passage is
//!   embedded as `"<title>. <headings above it>. <its text without markdown syntax>"`
//!   ([`markdown`]); what is stored and shown is still the verbatim slice;
//! - whole: one passage holding the whole text, embedded as `"<title> <text>"` and truncated by
//!   the embedder to its maximum — exactly how a BEIR evaluation embeds a corpus, so the
//!   gateway's ranking can be compared with `models::beir` document for document.

use std::{ops::Range, path::Path};

mod markdown;

use api::v1::Chunking;
use tokenizers::Tokenizer;

use crate::error::{GatewayError, Result};

/// The smallest window worth prefixing a title to; below it the title is left out of the
/// embedding input rather than crowding out the passage.
const MIN_WINDOW: usize = 32;

/// Tokens kept free when a title is prefixed: a window can start inside a word, and the
/// fragment tokenizes differently after "<title> " than inside the document (a few tokens
/// more, measured up to 1 with MiniLM).
const SLACK: usize = 8;

/// One passage to embed and store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Stored and shown: a verbatim slice of the document.
    pub text: String,
    /// What the embedder gets.
    pub embed_input: String,
}

pub struct Chunker {
    tokenizer: Tokenizer,
    /// Tokens the tokenizer adds around a text ([CLS] ... [SEP]: 2).
    specials: usize,
    /// The embedder's maximum input length in tokens, specials included, when known.
    pub model_max: Option<usize>,
    pub chunk_tokens: usize,
    pub overlap: usize,
}

impl Chunker {
    /// Loads the tokenizer of the model at `path`: a folder with `tokenizer.json` (and
    /// `sentence_bert_config.json` or `config.json` for the maximum length) or a GGUF file.
    pub fn load(path: &Path, chunk_tokens: usize, overlap: usize) -> Result<Self> {
        if chunk_tokens == 0 {
            return Err(GatewayError::Config("chunk tokens must be at least 1".into()));
        }
        if overlap >= chunk_tokens {
            return Err(GatewayError::Config(format!(
                "chunk overlap {overlap} must be smaller than chunk tokens {chunk_tokens}"
            )));
        }
        let (mut tokenizer, model_max) = if path.is_file() {
            let file =
                gguf::GgufFile::open(path).map_err(|e| GatewayError::Tokenizer(format!("{}: {e}", path.display())))?;
            let t = file.tokenizer().map_err(|e| GatewayError::Tokenizer(format!("{}: {e}", path.display())))?;
            (t.tokenizer, None)
        } else {
            let file = path.join("tokenizer.json");
            let t =
                Tokenizer::from_file(&file).map_err(|e| GatewayError::Tokenizer(format!("{}: {e}", file.display())))?;
            (t, max_length(path))
        };
        // The embedder decides about length; never let the file truncate or pad offsets away.
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| GatewayError::Tokenizer(e.to_string()))?;
        let specials = tokenizer.encode("", true).map_err(|e| GatewayError::Tokenizer(e.to_string()))?.len();
        Ok(Chunker { tokenizer, specials, model_max, chunk_tokens, overlap })
    }

    fn offsets(&self, text: &str) -> Result<Vec<Range<usize>>> {
        let enc = self.tokenizer.encode(text, false).map_err(|e| GatewayError::Tokenizer(e.to_string()))?;
        Ok(enc.get_offsets().iter().map(|&(a, b)| a..b).collect())
    }

    /// Tokens of `text` without special tokens.
    pub fn count(&self, text: &str) -> Result<usize> {
        Ok(self.tokenizer.encode(text, false).map_err(|e| GatewayError::Tokenizer(e.to_string()))?.len())
    }

    /// The passages of one document. Empty when the text holds no tokens.
    pub fn plan(&self, title: &str, text: &str, mode: Chunking) -> Result<Vec<Planned>> {
        if text.trim().is_empty() {
            return Ok(Vec::new());
        }
        if mode == Chunking::Whole {
            // Byte for byte what `models::beir` embeds, so rankings can be compared exactly.
            let embed_input = if title.is_empty() { text.to_string() } else { format!("{title} {text}") };
            return Ok(vec![Planned { text: text.to_string(), embed_input }]);
        }
        let title = title.trim();
        let offsets = self.offsets(text)?;
        if let Some(sections) = markdown::sections(text) {
            let mut out = Vec::new();
            for s in sections {
                out.extend(self.plan_section(title, text, &offsets, s)?);
            }
            return Ok(out);
        }
        let (window, prefix) = self.window(title)?;
        let chunks = chunk(text, &offsets, window, self.overlap)?;
        Ok(chunks
            .into_iter()
            .map(|c| Planned {
                text: c.to_string(),
                embed_input: if prefix { format!("{title} {c}") } else { c.to_string() },
            })
            .collect())
    }

    /// The tokens a passage may hold when embedded after `context`, and whether the context
    /// fits beside a window worth having ([`MIN_WINDOW`]); without it the passage is embedded
    /// alone.
    fn window(&self, context: &str) -> Result<(usize, bool)> {
        let mut window = self.chunk_tokens;
        let mut prefix = !context.is_empty();
        if let Some(max) = self.model_max.map(|m| m.saturating_sub(self.specials)) {
            let context_tokens = if prefix { self.count(context)? } else { 0 };
            if prefix && max >= context_tokens + SLACK + MIN_WINDOW {
                window = window.min(max - context_tokens - SLACK);
            } else {
                prefix = false;
                window = window.min(max.max(1));
            }
        }
        Ok((window, prefix))
    }

    /// The passages of one markdown section ([`markdown::sections`]): windows of its text
    /// alone, each embedded after the document's title and the section's headings, as plain
    /// text ([`markdown::plain`]).
    fn plan_section(
        &self,
        title: &str,
        text: &str,
        offsets: &[Range<usize>],
        section: markdown::Section,
    ) -> Result<Vec<Planned>> {
        let bytes = section.bytes;
        let mut context: Vec<&str> = Vec::new();
        for h in std::iter::once(title).chain(section.headings.iter().map(String::as_str)) {
            if !h.is_empty() && !context.iter().any(|c| c.eq_ignore_ascii_case(h)) {
                context.push(h);
            }
        }
        let context = context.join(". ");
        let (window, prefix) = self.window(&context)?;
        let from = offsets.partition_point(|t| t.start < bytes.start);
        let to = offsets.partition_point(|t| t.start < bytes.end);
        let local: Vec<Range<usize>> = offsets[from..to]
            .iter()
            .filter(|t| t.end <= bytes.end)
            .map(|t| t.start - bytes.start..t.end - bytes.start)
            .collect();
        let mut out = Vec::new();
        for c in chunk(&text[bytes], &local, window, self.overlap)? {
            let body = markdown::plain(c);
            let body = if body.is_empty() { c } else { body.as_str() };
            let mut embed_input = if prefix { format!("{context}. {body}") } else { body.to_string() };
            if self.model_max.is_some_and(|max| self.specials + self.count(&embed_input).unwrap_or(usize::MAX) > max) {
                // Plain text that tokenizes longer than the slice did: the slice, as budgeted.
                embed_input = if prefix { format!("{context}. {c}") } else { c.to_string() };
            }
            out.push(Planned { text: c.to_string(), embed_input });
        }
        Ok(out)
    }
}

/// `text` in windows of `window` tokens sharing up to half a window, as slices holding more
/// than whitespace.
fn chunk<'a>(text: &'a str, offsets: &[Range<usize>], window: usize, overlap: usize) -> Result<Vec<&'a str>> {
    let chunks = store::chunk_by_offsets(text, offsets, window, overlap.min(window / 2))
        .map_err(|e| GatewayError::Tokenizer(format!("chunking: {e}")))?;
    Ok(chunks.into_iter().map(|c| c.text).filter(|t| !t.trim().is_empty()).collect())
}

/// The embedder's maximum input length from its model folder: sentence-transformers'
/// `max_seq_length`, else the tokenizer's `model_max_length`, else `max_position_embeddings`.
fn max_length(dir: &Path) -> Option<usize> {
    let read = |name: &str, key: &str| -> Option<usize> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(name)).ok()?).ok()?;
        let n = v.get(key)?.as_u64()?;
        // tokenizer_config.json says "no limit" with a huge sentinel.
        (n > 0 && n < 1_000_000).then_some(n as usize)
    };
    read("sentence_bert_config.json", "max_seq_length")
        .or_else(|| read("tokenizer_config.json", "model_max_length"))
        .or_else(|| read("config.json", "max_position_embeddings"))
}
