//! all-MiniLM-L6-v2 against sentence-transformers' published behaviour.

use std::sync::Arc;

use models::{LoadOptions, load_embedder, ops::cosine};

use crate::support::*;

/// sentence-transformers' quickstart sentences and its published similarities.
const QUICKSTART: ([&str; 3], [f32; 3]) =
    (["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."], [0.6660, 0.1046, 0.1411]);

/// Three more sentences; expected values from an independent numpy implementation
/// (scripts/reference/minilm_numpy_reference.py). (These sentences are often quoted beside
/// the quickstart's numbers above, which belong to the quickstart sentences.)
const MORE: ([&str; 3], [f32; 3]) = (
    ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."],
    [0.7553, -0.1050, -0.0610],
);

#[test]
fn minilm_similarities_match_references_plain_and_masked() {
    let path = model("all-minilm-l6-v2");
    for (name, exec) in [("plain", plain()), ("masked", masked())] {
        let e = load_embedder(&path, exec, &LoadOptions::default()).unwrap();
        assert_eq!(e.dim(), 384);
        assert_eq!(e.max_tokens(), 256, "sentence_bert_config.json max_seq_length");
        for (sentences, want) in [QUICKSTART, MORE] {
            let v = e.embed(&sentences).unwrap();
            let sims = [cosine(&v[0], &v[1]), cosine(&v[0], &v[2]), cosine(&v[1], &v[2])];
            for (got, want) in sims.iter().zip(want) {
                assert!((got - want).abs() < 5e-4, "{name} {sentences:?}: {sims:?} vs {want}");
            }
            for x in &v {
                let n: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
                assert!((n - 1.0).abs() < 1e-5);
            }
        }
    }
}

#[test]
fn minilm_masked_equals_plain_and_batched_equals_single() {
    let path = model("all-minilm-l6-v2");
    let p = load_embedder(&path, plain(), &LoadOptions::default()).unwrap();
    let m = load_embedder(&path, masked(), &LoadOptions::default()).unwrap();
    let texts = ["short", "a somewhat longer sentence about retrieval-augmented generation", "x"];
    let vp = p.embed(&texts).unwrap();
    let vm = m.embed(&texts).unwrap();
    for (a, b) in vp.iter().zip(&vm) {
        assert!(cosine(a, b) > 0.99999, "masked drifted: {}", cosine(a, b));
    }
    for (i, t) in texts.iter().enumerate() {
        let single = m.embed(&[t]).unwrap();
        assert!(cosine(&single[0], &vm[i]) > 0.99999);
    }
}

/// The dual-LPN protection returns the quantized plaintext path's embeddings bit for bit,
/// and that path stays close to f32 (its retrieval quality is measured in
/// docs/SECURITY.md); its counts follow the analysis' formulas.
#[test]
fn minilm_dual_lpn_equals_its_int8_reference() {
    let path = model("all-minilm-l6-v2");
    let lpn = dual_lpn();
    let l = load_embedder(&path, lpn.clone(), &LoadOptions::default()).unwrap();
    let r = load_embedder(&path, int8_reference(), &LoadOptions::default()).unwrap();
    let p = load_embedder(&path, plain(), &LoadOptions::default()).unwrap();
    let texts = ["short", "a somewhat longer sentence about retrieval-augmented generation", "x"];
    let (vl, vr, vp) = (l.embed(&texts).unwrap(), r.embed(&texts).unwrap(), p.embed(&texts).unwrap());
    assert_eq!(vl, vr, "dual-lpn must equal the quantized plaintext path exactly");
    for (a, b) in vr.iter().zip(&vp) {
        assert!(cosine(a, b) > 0.99, "int8 per-row rounding drifted: {}", cosine(a, b));
    }
    let c = lpn.counts();
    let t = protocol::noise_weight(384).unwrap() as u64;
    // Per layer: q/k/v share one masked input, then o, up, down: t·(d_in + Σ d_out) each.
    let per_row = 6 * t * ((384 + 3 * 384) + (384 + 384) + (384 + 1536) + (1536 + 384));
    assert_eq!(c.mask_macs + c.unmask_macs, c.rows / 24 * per_row, "counts: {c:?}");
    let held = lpn.table_bytes_held();
    eprintln!("minilm dual-lpn: {held} bytes of tables and codes; counts {c:?}");
    assert!(held > 16 * 6 * (4 * 384 * 384 + 2 * 384 * 1536), "tables are 16x the int8 weights");
}

#[test]
fn max_seq_length_is_honoured_not_the_tokenizer_files_128() {
    let path = model("all-minilm-l6-v2");
    let e = load_embedder(&path, plain(), &LoadOptions::default()).unwrap();
    let long = "word ".repeat(400);
    assert_eq!(e.count_tokens(&long).unwrap(), 402, "400 words + [CLS] + [SEP] before truncation");
    assert_eq!(e.max_tokens(), 256);
    let short = load_embedder(&path, plain(), &LoadOptions { max_seq_length: Some(64), ..Default::default() }).unwrap();
    assert_eq!(short.max_tokens(), 64);
    // Truncation keeps the first max_len − 1 tokens and the closing [SEP]: a text that
    // differs only after token 254 embeds identically; one that differs before does not.
    let a = format!("{}alpha", "word ".repeat(300));
    let b = format!("{}omega", "word ".repeat(300));
    let c = format!("alpha {}", "word ".repeat(300));
    let v = e.embed(&[a.as_str(), b.as_str(), c.as_str()]).unwrap();
    assert_eq!(v[0], v[1]);
    assert_ne!(v[0], v[2]);
}

/// The model-level check of the GPU engine: a full masked MiniLM forward on the Vulkan engine (Mesa's
/// lavapipe in CI) gives the CPU engine's embeddings.
#[test]
fn minilm_masked_on_the_vulkan_engine_equals_the_cpu_engine() {
    use protocol::Engine;
    use protocol::{MaskedConfig, MaskedExecutor};
    let path = model("all-minilm-l6-v2");
    let vulkan: Arc<dyn Engine> = kernels_wgpu::open_engine("vulkan").expect("a Vulkan adapter (CI installs lavapipe)");
    let on_gpu: Arc<dyn protocol::Executor> = Arc::new(MaskedExecutor::new(vulkan, MaskedConfig::default()).unwrap());
    let g = load_embedder(&path, on_gpu, &LoadOptions::default()).unwrap();
    let c = load_embedder(&path, masked(), &LoadOptions::default()).unwrap();
    let texts = [
        "A man is eating food.",
        "Confidential retrieval keeps every plaintext inside the attested VM while the GPU multiplies masked rows.",
        "x",
    ];
    // With the long text, the pass has a large mask block (its products are copied out of
    // the engine); the short ones alone are all small blocks, whose products are recovered
    // straight from the engine's mapped read-back.
    for texts in [&texts[..], &[texts[0], texts[2]]] {
        let (vg, vc) = (g.embed(texts).unwrap(), c.embed(texts).unwrap());
        for ((a, b), t) in vg.iter().zip(&vc).zip(texts) {
            let cos = cosine(a, b);
            assert!(cos >= 0.99999, "{t:?}: cosine {cos} between the Vulkan and CPU engines");
        }
    }
}

/// A pair is cut where its tokens are counted exactly as the tokenizer's own truncation
/// (longest first) cuts it, and the count is the length before the cut.
#[test]
fn pairs_are_cut_like_the_tokenizers_own_truncation() {
    let dir = model("all-minilm-l6-v2");
    let tok = models::tokenizer::TextTokenizer::from_dir(&dir).unwrap();
    let query = "what does the gateway keep from the untrusted gpu";
    let long = "the sealed store keeps every passage under a key derived from the launch ".repeat(8);
    for (a, b) in [(query, long.as_str()), (long.as_str(), query), (query, "short answer")] {
        let (whole, _) = tok.encode_pair(a, b).unwrap();
        for max in [8, 13, 20, 64, 512] {
            let (ids, types, counted) = tok.encode_pair_within(a, b, max).unwrap();
            assert_eq!(counted, whole.len());
            // Cut to exactly `max` when over it, untouched when within it.
            assert_eq!(ids.len(), whole.len().min(max), "max {max}");
            assert_eq!(ids.first(), whole.first());
            assert_eq!(ids.last(), whole.last(), "the closing [SEP] survives the cut");
            let reference = models::tokenizer::TextTokenizer::from_dir(&dir).unwrap().with_max_length(max).unwrap();
            let (want_ids, want_types) = reference.encode_pair(a, b).unwrap();
            assert_eq!((ids, types), (want_ids, want_types), "max {max}");
        }
    }
}
