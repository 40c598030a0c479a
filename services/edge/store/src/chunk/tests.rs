use proptest::prelude::*;

use super::*;

/// Maximal runs of non-whitespace: the simplest tokenizer with real offsets.
fn whitespace_tokens(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                out.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(s..text.len());
    }
    out
}

/// Like a byte-level BPE on multi-byte characters: one token per ASCII character, two tokens
/// with the same offsets for any other character.
fn split_multibyte_tokens(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for (i, c) in text.char_indices() {
        let r = i..i + c.len_utf8();
        if c.len_utf8() > 1 {
            out.push(r.clone());
        }
        out.push(r);
    }
    out
}

/// Invariants every chunking must meet: slices of the text, in order, advancing, covering the
/// text from byte 0 to the end with no gap, each holding the tokens it claims.
fn check_cover(text: &str, offsets: &[Range<usize>], chunks: &[TextChunk<'_>]) {
    if offsets.is_empty() {
        assert!(chunks.is_empty());
        return;
    }
    assert!(!chunks.is_empty());
    assert_eq!(chunks[0].bytes.start, 0);
    assert_eq!(chunks.last().unwrap().bytes.end, text.len());
    assert_eq!(chunks[0].tokens.start, 0);
    assert_eq!(chunks.last().unwrap().tokens.end, offsets.len());
    let mut rebuilt = String::new();
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c.text, &text[c.bytes.clone()]);
        assert!(!c.tokens.is_empty());
        // Exactly the claimed tokens start inside the chunk.
        let inside: Vec<usize> = (0..offsets.len()).filter(|&t| c.bytes.contains(&offsets[t].start)).collect();
        assert_eq!(inside, c.tokens.clone().collect::<Vec<_>>(), "chunk {i}");
        if i > 0 {
            let p = &chunks[i - 1];
            assert!(c.bytes.start > p.bytes.start && c.bytes.end > p.bytes.end, "chunk {i} advances");
            assert!(c.bytes.start <= p.bytes.end, "no gap before chunk {i}");
            assert!(c.tokens.start <= p.tokens.end);
            rebuilt.push_str(&text[p.bytes.end..c.bytes.end]);
        } else {
            rebuilt.push_str(c.text);
        }
    }
    assert_eq!(rebuilt, text);
}

fn text_strategy() -> impl Strategy<Value = String> {
    // Words, runs of mixed whitespace, multi-byte characters.
    prop::collection::vec(prop_oneof!["[a-z]{1,8}", "[ \t\n]{1,3}", "[äöüß€日本語]{1,3}",], 0..120)
        .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn whitespace_chunks_cover_bound_and_overlap(
        text in text_strategy(),
        max_tokens in 1usize..12,
        overlap_frac in 0.0f64..1.0,
    ) {
        let overlap = ((max_tokens as f64) * overlap_frac) as usize; // < max_tokens
        let offsets = whitespace_tokens(&text);
        let chunks = chunk_text(&text, whitespace_tokens, max_tokens, overlap).unwrap();
        check_cover(&text, &offsets, &chunks);
        for (i, c) in chunks.iter().enumerate() {
            // Re-tokenizing a chunk gives the tokens it claims: no more than max_tokens.
            let inner = whitespace_tokens(c.text);
            prop_assert_eq!(inner.len(), c.tokens.len());
            prop_assert!(inner.len() <= max_tokens);
            if i + 1 < chunks.len() {
                // Every chunk but the last is full, and the next one repeats its last
                // `overlap` tokens, word for word.
                prop_assert_eq!(c.tokens.len(), max_tokens);
                let next = &chunks[i + 1];
                prop_assert_eq!(c.tokens.end - next.tokens.start, overlap);
                let tail: Vec<&str> = inner[inner.len() - overlap..].iter().map(|r| &c.text[r.clone()]).collect();
                let head: Vec<&str> = whitespace_tokens(next.text)[..overlap].iter().map(|r| &next.text[r.clone()]).collect();
                prop_assert_eq!(tail, head);
            }
        }
    }

    #[test]
    fn shared_offsets_are_never_split(
        text in text_strategy(),
        max_tokens in 2usize..12,
        overlap_frac in 0.0f64..1.0,
    ) {
        let overlap = ((max_tokens as f64) * overlap_frac) as usize;
        let offsets = split_multibyte_tokens(&text);
        let chunks = chunk_by_offsets(&text, &offsets, max_tokens, overlap).unwrap();
        check_cover(&text, &offsets, &chunks);
        for c in &chunks {
            // Units are at most 2 tokens, so with max_tokens >= 2 the bound always holds.
            prop_assert!(c.tokens.len() <= max_tokens);
            // A cut never falls between two tokens with the same start.
            if c.tokens.start > 0 {
                prop_assert!(offsets[c.tokens.start].start > offsets[c.tokens.start - 1].start);
            }
            if c.tokens.end < offsets.len() {
                prop_assert!(offsets[c.tokens.end].start > offsets[c.tokens.end - 1].start);
            }
        }
    }
}

#[test]
fn small_examples() {
    let text = "a b c d e";
    let chunks = chunk_text(text, whitespace_tokens, 3, 1).unwrap();
    let texts: Vec<&str> = chunks.iter().map(|c| c.text).collect();
    assert_eq!(texts, ["a b c ", "c d e"]);
    let chunks = chunk_text("  lead and trail  ", whitespace_tokens, 2, 0).unwrap();
    let texts: Vec<&str> = chunks.iter().map(|c| c.text).collect();
    assert_eq!(texts, ["  lead and ", "trail  "]);
    assert!(chunk_text("   ", whitespace_tokens, 4, 1).unwrap().is_empty());
    assert!(chunk_text("", whitespace_tokens, 4, 1).unwrap().is_empty());
}

#[test]
fn a_unit_larger_than_max_tokens_stands_alone() {
    // Five tokens share one start: the chunk must hold all five.
    let text = "ab cd";
    let offsets = vec![0..2, 0..2, 0..2, 0..2, 0..2, 3..5];
    let chunks = chunk_by_offsets(text, &offsets, 2, 1).unwrap();
    check_cover(text, &offsets, &chunks);
    assert_eq!(chunks[0].tokens, 0..5);
    assert_eq!(chunks[1].tokens, 5..6);
}

#[test]
fn rejects_bad_parameters_and_offsets() {
    let text = "héllo world";
    assert!(matches!(chunk_text(text, whitespace_tokens, 0, 0), Err(StoreError::InvalidInput(_))));
    assert!(matches!(chunk_text(text, whitespace_tokens, 3, 3), Err(StoreError::InvalidInput(_))));
    // Past the end, inside a character, out of order, start after end.
    #[allow(clippy::reversed_empty_ranges, clippy::single_range_in_vec_init)]
    let bad: [&[Range<usize>]; 4] = [&[0..50], &[2..4], &[6..11, 0..5], &[3..1]];
    for offsets in bad {
        assert!(matches!(chunk_by_offsets(text, offsets, 4, 1), Err(StoreError::InvalidInput(_))), "{offsets:?}");
    }
}
