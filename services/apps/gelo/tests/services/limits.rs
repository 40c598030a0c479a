//! The limits set by flag or environment variable, against running processes: an
//! over-limit request is INVALID_ARGUMENT with the limit named, one within it is served.

use std::sync::Arc;

use api::v1::{EmbedRequest, GenerateRequest, embedder_client::EmbedderClient, generator_client::GeneratorClient};
use models::{LoadOptions, load_embedder, ops::cosine};
use protocol::SealedExecutor;
use tonic::Code;

use crate::support::*;

fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, what: &str, limit: usize) {
    let s = r.expect_err("over the limit");
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    for needle in [what.to_string(), format!("exceeds the limit of {limit}")] {
        assert!(s.message().contains(&needle), "{:?} should mention {needle:?}", s.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_per_text_flag_limits_each_text() {
    let path = model("all-minilm-l6-v2");
    let p = Proc::start(
        "embedder-limits",
        &["embedder", "--model", path.to_str().unwrap(), "--max-tokens-per-text", "16"],
        &[],
    );
    let mut c = EmbedderClient::new(connect(&p, None).await.channel());
    let long =
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen".to_string();
    let req = |texts: Vec<String>, truncate| EmbedRequest { texts, truncate, ..Default::default() };
    refused(c.embed(req(vec!["short".into(), long.clone()], false)).await, "texts[1] tokens", 16);
    // Within the limit, or cut to it on request: served.
    c.embed(req(vec!["short".into()], false)).await.unwrap();
    let cut = c.embed(req(vec![long.clone()], true)).await.unwrap().into_inner();
    // The limit is enforced where it is counted: the model saw the 16 tokens counted (the
    // text cut by the model's own rule), not the text cut at the model's 256.
    assert_eq!(cut.usage.unwrap().prompt_tokens, 16);
    let local = load_embedder(&path, Arc::new(SealedExecutor::new()), &LoadOptions::default()).unwrap();
    let at_16 = local.embed_tokens(&[local.tokenize(&long, 16).unwrap().tokens]).unwrap();
    let whole = local.embed(&[long.as_str()]).unwrap();
    assert!(cosine(&cut.embeddings[0].values, &at_16[0]) > 0.99999);
    assert!(cosine(&cut.embeddings[0].values, &whole[0]) < 0.999, "the whole text was embedded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_prompt_tokens_flag_and_max_stop_strings_variable_limit_generate() {
    let path = model("smollm2-135m-instruct.gguf");
    let p = Proc::start(
        "generator-limits",
        &["generator", "--model", path.to_str().unwrap(), "--max-prompt-tokens", "32"],
        &[("GELO_MAX_STOP_STRINGS", "2")],
    );
    let mut c = GeneratorClient::new(connect(&p, None).await.channel());
    let req = |prompt: String, stop: usize| GenerateRequest {
        raw_prompt: prompt,
        max_tokens: 2,
        stop: (0..stop).map(|i| format!("stop{i}")).collect(),
        ..Default::default()
    };
    refused(c.generate(req("one, two, three, ".repeat(20), 0)).await, "prompt tokens", 32);
    refused(c.generate(req("1, 2, 3,".into(), 3)).await, "stop strings", 2);
    let mut s = c.generate(req("1, 2, 3,".into(), 2)).await.unwrap().into_inner();
    while s.message().await.unwrap().is_some() {}
}
