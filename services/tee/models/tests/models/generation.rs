//! Generation: batched == single, seeded sampling reproduces, limits give clear errors,
//! stop strings and streaming.

use models::{
    ChatMessage, FinishReason, GenerateRequest, Limit, ModelError, Prompt, Refusal, SamplingParams, load_generator,
};

use crate::support::*;

const SMOL: &str = "smollm2-135m-instruct.gguf";

#[test]
fn batched_decode_equals_single_runs() {
    let mut g = load_generator(&model(SMOL), masked(), &Default::default()).unwrap();
    let prompts =
        ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time", "Water boils at"];
    let reqs: Vec<GenerateRequest> =
        prompts.iter().map(|p| GenerateRequest::greedy(Prompt::Raw(p.to_string()), 16)).collect();
    let singles: Vec<_> = reqs.iter().map(|r| g.generate(r, |_| true).unwrap()).collect();
    // One pass for the batch, the default two concurrent groups, and uneven groups (2, 2, 1).
    for groups in [1, 2, 3] {
        g.decoder.set_decode_groups(groups);
        let batched = g.generate_batch(&reqs).unwrap();
        for (single, b) in singles.iter().zip(&batched) {
            assert_eq!(single.tokens, b.tokens, "{groups} group(s)");
            assert_eq!(single.text, b.text, "{groups} group(s)");
        }
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let g = load_generator(&model(SMOL), plain(), &Default::default()).unwrap();
    let req = |seed| GenerateRequest {
        prompt: Prompt::Chat(vec![ChatMessage::new("user", "Write a word.")]),
        max_tokens: 12,
        sampling: SamplingParams { temperature: 1.2, top_k: 50, top_p: 0.95, seed, ..Default::default() },
        stop: vec![],
        stop_repeated_words: 0,
    };
    let a = g.generate(&req(42), |_| true).unwrap();
    let b = g.generate(&req(42), |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
    let others: Vec<_> = (1..6).map(|s| g.generate(&req(s), |_| true).unwrap().tokens).collect();
    assert!(others.iter().any(|t| t != &a.tokens), "different seeds never changed the sample");
    // A caller that stops the stream gets a cancellation, not an invalid request; stopping
    // after the third chunk too.
    assert!(matches!(g.generate(&req(42), |_| false), Err(ModelError::Cancelled)));
    let mut chunks = 0;
    let stopped = g.generate(&req(42), |_| {
        chunks += 1;
        chunks < 3
    });
    assert!(matches!(stopped, Err(ModelError::Cancelled)));
    assert_eq!(chunks, 3);
}

#[test]
fn too_long_a_context_is_a_clear_error() {
    let g =
        load_generator(&model(SMOL), plain(), &models::LoadOptions { max_seq_length: Some(64), ..Default::default() })
            .unwrap();
    let req = GenerateRequest::greedy(Prompt::Raw("word ".repeat(40)), 32);
    match g.generate(&req, |_| true) {
        Err(ModelError::Refused(Refusal::TooLarge { what: Limit::Context, got, limit })) => {
            assert!(got > limit && limit == 64)
        }
        other => panic!("expected the context refused, got {:?}", other.map(|c| c.tokens)),
    }
    let bad = GenerateRequest {
        sampling: SamplingParams { temperature: -1.0, ..Default::default() },
        ..GenerateRequest::greedy(Prompt::Raw("hi".into()), 4)
    };
    assert!(matches!(g.generate(&bad, |_| true), Err(ModelError::Refused(Refusal::Sampling { .. }))));
    let role = GenerateRequest::greedy(Prompt::Chat(vec![ChatMessage::new("wizard", "hi")]), 4);
    assert!(matches!(g.generate(&role, |_| true), Err(ModelError::Refused(Refusal::UnknownRole { index: 0 }))));
}

#[test]
fn stop_strings_end_generation_and_streaming_adds_up() {
    let g = load_generator(&model(SMOL), plain(), &Default::default()).unwrap();
    let base = GenerateRequest::greedy(Prompt::Raw("The capital of France is".into()), 32);
    let full = g.generate(&base, |_| true).unwrap();
    assert!(full.text.contains('\n'), "fixture assumption: the continuation has a newline: {:?}", full.text);
    let stopped = g.generate(&GenerateRequest { stop: vec!["\n".into()], ..base.clone() }, |_| true).unwrap();
    assert_eq!(stopped.finish, FinishReason::Stop);
    assert_eq!(stopped.text, full.text[..full.text.find('\n').unwrap()]);
    // Streamed chunks concatenate to the final text, and arrive one step at a time.
    let mut streamed = String::new();
    let mut chunks = 0;
    let done = g
        .generate(&base, |c| {
            streamed.push_str(&c.text);
            chunks += 1;
            true
        })
        .unwrap();
    assert_eq!(streamed, done.text);
    assert_eq!(chunks, done.tokens.len() + usize::from(done.finish == FinishReason::Stop));
}
