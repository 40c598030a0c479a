//! Chunking with the embedder's real tokenizer (MiniLM from the offline model cache).

use std::path::PathBuf;

use api::v1::Chunking;
use gateway::chunker::Chunker;

fn model(name: &str) -> PathBuf {
    let root = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/gelo"));
    let p = root.join("models").join(name);
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}

fn text(sentences: usize) -> String {
    (0..sentences).map(|i| format!("Sentence number {i} says something about café crème and naïve résumés. ")).collect()
}

#[test]
fn passages_fit_the_embedder_with_their_title_and_cover_the_text() {
    let c = Chunker::load(&model("all-minilm-l6-v2"), 200, 40).unwrap();
    assert_eq!(c.model_max, Some(256), "sentence_bert_config.json's max_seq_length");
    let body = text(120);
    let title: String = "A rather long title about the chunking of documents ".repeat(8);
    let title_tokens = c.count(title.trim()).unwrap();
    assert!(title_tokens > 56, "{title_tokens}");
    let passages = c.plan(&title, &body, Chunking::Tokens).unwrap();
    assert!(passages.len() > 5);
    for p in &passages {
        assert!(p.embed_input.starts_with(title.trim()), "the title is embedded with every passage");
        // [CLS] + title + passage + [SEP] within the model's 256 tokens: nothing is truncated.
        let n = c.count(&p.embed_input).unwrap() + 2;
        assert!(n <= 256, "{n} tokens");
        assert!(c.count(&p.text).unwrap() <= 254 - 8 - title_tokens);
    }
    // Verbatim slices that cover the whole text, in order, overlapping.
    assert!(body.starts_with(passages[0].text.as_str()));
    assert!(body.ends_with(passages.last().unwrap().text.as_str()));
    let (mut search_from, mut covered) = (0, 0);
    for p in &passages {
        let at =
            body[search_from..].find(p.text.as_str()).map(|i| i + search_from).expect("a slice of the text, in order");
        assert!(at <= covered, "a gap before byte {at}");
        assert!(at + p.text.len() > covered, "a passage that adds nothing");
        covered = at + p.text.len();
        search_from = at + 1;
    }
    assert_eq!(covered, body.len());

    // Without a title the window is the configured 200 tokens.
    let plain = c.plan("", &body, Chunking::Tokens).unwrap();
    // 200 tokens as the document tokenizes them; a window starting inside a word may take a few more alone.
    assert!(plain.iter().all(|p| p.embed_input == p.text && c.count(&p.text).unwrap() <= 208));
    assert!(plain.len() < passages.len(), "a long title leaves less room per passage");
}

#[test]
fn markdown_passages_end_at_headings_and_are_embedded_under_them() {
    let c = Chunker::load(&model("all-minilm-l6-v2"), 200, 40).unwrap();
    let doc = format!(
        "# GELO\n\n## The web console\n\n{}\n\n## Test it\n\n```sh\nbash scripts/test.sh\n```\n\n\
         `scripts/test.sh` sets a **fresh** machine up: see [the setup](scripts/setup.sh).\n\n{}",
        text(30),
        text(30).replace("Sentence", "Line")
    );
    let passages = c.plan("GELO", &doc, Chunking::Tokens).unwrap();
    // A window never crosses a heading: each passage lies in one section.
    let test_it = doc.find("## Test it").unwrap();
    let mut from = 0;
    for p in &passages {
        let at = doc[from..].find(p.text.as_str()).map(|i| i + from).expect("a slice of the text, in order");
        assert!(at + p.text.len() <= test_it || at >= test_it, "a passage straddles a heading: {:?}", p.text);
        from = at + 1;
        assert!(c.count(&p.embed_input).unwrap() + 2 <= 256, "fits the embedder");
        assert!(!p.embed_input.contains('`') && !p.embed_input.contains("##"), "{}", p.embed_input);
    }
    // The section's first passage and the ones after it are embedded under its heading, as
    // prose; the title is not repeated for the top heading that names it.
    let under: Vec<_> = passages.iter().filter(|p| doc.find(p.text.as_str()).unwrap() >= test_it).collect();
    assert!(under.len() >= 2, "{}", under.len());
    assert!(under.iter().all(|p| p.embed_input.starts_with("GELO. Test it. ")), "{:?}", under[1].embed_input);
    assert!(under[0].text.starts_with("## Test it"));
    assert!(
        under[0].embed_input.contains("bash scripts/test.sh scripts/test.sh sets a fresh machine up: see the setup.")
    );
    let first = &passages[0];
    assert!(first.text.starts_with("# GELO\n\n## The web console"), "a heading alone joins the next section");
    assert!(first.embed_input.starts_with("GELO. The web console. Sentence number 0"), "{}", first.embed_input);
}

#[test]
fn whole_documents_are_embedded_exactly_like_beir() {
    let c = Chunker::load(&model("all-minilm-l6-v2"), 200, 40).unwrap();
    let p = c.plan("Title ", "Body text.", Chunking::Whole).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].embed_input, "Title  Body text.", "title + \" \" + text, untouched");
    assert_eq!(p[0].text, "Body text.");
    assert_eq!(c.plan("", "Body.", Chunking::Whole).unwrap()[0].embed_input, "Body.");
    assert!(c.plan("T", " \n\t", Chunking::Whole).unwrap().is_empty());
    assert!(c.plan("T", "", Chunking::Tokens).unwrap().is_empty());
}

#[test]
fn a_gguf_tokenizer_and_bad_settings() {
    let c = Chunker::load(&model("smollm2-135m-instruct.gguf"), 64, 8).unwrap();
    assert_eq!(c.model_max, None);
    let passages = c.plan("", &text(40), Chunking::Tokens).unwrap();
    assert!(passages.len() > 3 && passages.iter().all(|p| c.count(&p.text).unwrap() <= 64));
    assert!(Chunker::load(&model("all-minilm-l6-v2"), 10, 10).is_err(), "overlap must be below the window");
    assert!(Chunker::load(&model("all-minilm-l6-v2"), 0, 0).is_err());
    assert!(Chunker::load(&std::env::temp_dir().join("no-such-model"), 10, 2).is_err());
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn minilm() -> &'static Chunker {
        static C: std::sync::OnceLock<Chunker> = std::sync::OnceLock::new();
        C.get_or_init(|| Chunker::load(&model("all-minilm-l6-v2"), 200, 40).unwrap())
    }

    /// Text a client may send: any Unicode, runs without a space, control characters, long
    /// words, runs of whitespace.
    fn hostile_text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,400}",
            "\\PC{0,400}",
            "[a-zé \\n\\t.,]{0,3000}",
            (1usize..4000).prop_map(|n| "x".repeat(n)),
            (1usize..800).prop_map(|n| "🦀\u{301}".repeat(n)),
            (1usize..2000).prop_map(|n| "\u{0}\r\n ".repeat(n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever the text and title: a result, never a panic; each passage a verbatim slice
        /// of the text, in order, holding more than whitespace; and with its title within the
        /// embedder's 256 tokens, so nothing a client sent is cut off silently.
        #[test]
        fn any_text_chunks_into_in_order_slices_that_fit(title in ".{0,60}", text in hostile_text()) {
            let c = minilm();
            let passages = c.plan(&title, &text, Chunking::Tokens).unwrap();
            let mut from = 0;
            for p in &passages {
                prop_assert!(!p.text.trim().is_empty());
                let at = text[from..].find(p.text.as_str()).map(|i| i + from);
                prop_assert!(at.is_some(), "not a slice of the text, in order");
                // The next passage starts after this one's first character (they overlap).
                from = at.unwrap() + p.text.chars().next().map_or(1, char::len_utf8);
                let n = c.count(&p.embed_input).unwrap() + 2;
                prop_assert!(n <= 256, "{} tokens with the title", n);
            }
            prop_assert_eq!(passages.is_empty(), text.trim().is_empty() || c.count(&text).unwrap() == 0);
        }
    }
}
