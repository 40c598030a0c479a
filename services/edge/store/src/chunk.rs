//! Splitting a document into passages by tokens, with overlap, for the gateway's ingest.
//!
//! The gateway passes the embedder's own tokenizer (as token byte offsets), so that "at most
//! `max_tokens` tokens" means what the embedder will see. Chunks are slices of the original
//! text: together they cover it completely, whitespace included, so nothing is lost between
//! passages and a passage quoted back to the user is verbatim.
//!
//! Token boundaries. Chunk `[s, e)` (token indices) spans the bytes from the start of token `s`
//! to the start of token `e` (from byte 0 for the first chunk, to the end of the text for the
//! last), so it contains exactly the tokens `s..e`. That needs token starts to strictly
//! increase at a cut; byte-level BPE tokenizers give several tokens the same offsets when they
//! split one multi-byte character, so cuts are only made where the start changes. Tokens that
//! share a start form one unit that is never split: overlap is then rounded to whole units, and
//! a chunk exceeds `max_tokens` only if a single unit does.

use std::ops::Range;

use crate::error::{Result, StoreError};

/// One passage: a slice of the text and the tokens it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextChunk<'a> {
    pub text: &'a str,
    /// Byte range of `text` in the document.
    pub bytes: Range<usize>,
    /// Token indices (into the tokenizer's output) that this chunk holds.
    pub tokens: Range<usize>,
}

/// Chunks `text` into passages of at most `max_tokens` tokens, consecutive passages sharing
/// `overlap` tokens. `tokenize` returns each token's byte range in `text`, in order (what
/// `tokenizers::Encoding::get_offsets` gives, without special tokens).
///
/// A text without tokens (empty or whitespace) gives no chunks.
pub fn chunk_text<'a, F>(text: &'a str, tokenize: F, max_tokens: usize, overlap: usize) -> Result<Vec<TextChunk<'a>>>
where
    F: FnOnce(&str) -> Vec<Range<usize>>,
{
    let offsets = tokenize(text);
    chunk_by_offsets(text, &offsets, max_tokens, overlap)
}

/// [`chunk_text`] for a caller that already has the token offsets (say, from a fallible
/// tokenizer whose error it wants to handle itself).
pub fn chunk_by_offsets<'a>(
    text: &'a str,
    offsets: &[Range<usize>],
    max_tokens: usize,
    overlap: usize,
) -> Result<Vec<TextChunk<'a>>> {
    if max_tokens == 0 {
        return Err(StoreError::invalid("max_tokens must be at least 1"));
    }
    if overlap >= max_tokens {
        return Err(StoreError::invalid("overlap must be smaller than max_tokens"));
    }
    validate_offsets(text, offsets)?;
    if offsets.is_empty() {
        return Ok(Vec::new());
    }

    // Units: runs of tokens sharing a start offset. `unit_start[u]` is the first token of
    // unit u; a sentinel at the end makes `unit_start[u + 1] - unit_start[u]` its size.
    let mut unit_start: Vec<usize> = Vec::with_capacity(offsets.len() + 1);
    for (i, t) in offsets.iter().enumerate() {
        if i == 0 || t.start > offsets[i - 1].start {
            unit_start.push(i);
        }
    }
    let units = unit_start.len();
    unit_start.push(offsets.len());
    let tokens_in = |a: usize, b: usize| unit_start[b] - unit_start[a];

    let byte_at = |unit: usize| -> usize {
        if unit == 0 {
            0
        } else if unit == units {
            text.len()
        } else {
            offsets[unit_start[unit]].start
        }
    };

    let mut chunks = Vec::new();
    // The first chunk: as many whole units as fit (always at least one).
    let (mut a, mut b) = (0usize, 1usize);
    while b < units && tokens_in(a, b + 1) <= max_tokens {
        b += 1;
    }
    loop {
        let bytes = byte_at(a)..byte_at(b);
        chunks.push(TextChunk { text: &text[bytes.clone()], bytes, tokens: unit_start[a]..unit_start[b] });
        if b == units {
            return Ok(chunks);
        }
        // Start the next chunk `overlap` tokens back (whole units), but after this chunk's start
        // so that chunking advances ...
        let mut next = b;
        while next - 1 > a && tokens_in(next - 1, b) <= overlap {
            next -= 1;
        }
        // ... and late enough that it reaches past this chunk's end.
        while next < b && tokens_in(next, b + 1) > max_tokens {
            next += 1;
        }
        a = next;
        b += 1;
        while b < units && tokens_in(a, b + 1) <= max_tokens {
            b += 1;
        }
    }
}

fn validate_offsets(text: &str, offsets: &[Range<usize>]) -> Result<()> {
    let mut prev_start = 0;
    for (i, t) in offsets.iter().enumerate() {
        if t.start > t.end || t.end > text.len() {
            return Err(StoreError::invalid(format!("token {i} has a byte range outside the text")));
        }
        if !text.is_char_boundary(t.start) {
            return Err(StoreError::invalid(format!("token {i} does not start on a character boundary")));
        }
        if t.start < prev_start {
            return Err(StoreError::invalid(format!("token {i} starts before the token preceding it")));
        }
        prev_start = t.start;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
