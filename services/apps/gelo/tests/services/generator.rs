use std::{sync::Arc, time::Instant};

use api::v1::{ChatMessage, FinishReason, GenerateRequest, generator_client::GeneratorClient};
use kernels::CpuEngine;
use models::{GenerateRequest as Req, LoadOptions, Prompt, load_generator};
use protocol::{MaskedConfig, MaskedExecutor};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generator_process_streams_the_in_process_greedy_tokens() {
    let path = model("smollm2-135m-instruct.gguf");
    let p = Proc::start("generator", &["generator", "--model", path.to_str().unwrap()], &[]);
    let mut client = GeneratorClient::new(connect(&p, Some(identity(&path))).await.channel());

    let exec = Arc::new(MaskedExecutor::new(Arc::new(CpuEngine::new()), MaskedConfig::default()).unwrap());
    let local = load_generator(&path, exec, &LoadOptions::default()).unwrap();

    // Raw completion, long enough to watch it stream.
    let prompt = "1, 2, 3, 4, 5, 6,";
    let want = local.generate(&Req::greedy(Prompt::Raw(prompt.into()), 40), |_| true).unwrap();
    let req = GenerateRequest { raw_prompt: prompt.into(), max_tokens: 40, ..Default::default() };
    let t = Instant::now();
    let mut stream = client.generate(req).await.unwrap().into_inner();
    let (mut ids, mut text, mut arrivals, mut last) = (Vec::new(), String::new(), Vec::new(), None);
    while let Some(msg) = stream.message().await.unwrap() {
        arrivals.push(t.elapsed());
        ids.extend(msg.token_ids.iter().copied());
        text.push_str(&msg.text);
        if msg.finish_reason != FinishReason::Unspecified as i32 {
            last = Some(msg);
        }
    }
    assert_eq!(ids, want.tokens, "served greedy tokens differ from in-process");
    assert_eq!(text, want.text);
    let last = last.expect("a final message with the finish reason");
    let usage = last.usage.expect("usage on the final message");
    assert_eq!(usage.completion_tokens as usize, want.tokens.len());
    assert_eq!(usage.prompt_tokens as usize, want.prompt_tokens);
    // Streaming, not buffering: the first chunk arrived well before the last token was
    // computed (decoding 40 tokens takes far longer than delivering one message).
    assert!(arrivals.len() >= 20, "{} messages", arrivals.len());
    let spread = *arrivals.last().unwrap() - arrivals[0];
    assert!(spread.as_millis() >= 100, "all chunks arrived within {spread:?}: buffered?");

    // Chat with a stop string and a seed.
    let chat = GenerateRequest {
        messages: vec![ChatMessage { role: "user".into(), content: "Count from one to ten in words.".into() }],
        max_tokens: 48,
        stop: vec!["five".into()],
        ..Default::default()
    };
    let mut s = client.generate(chat).await.unwrap().into_inner();
    let mut out = String::new();
    let mut finish = 0;
    while let Some(m) = s.message().await.unwrap() {
        out.push_str(&m.text);
        if m.finish_reason != 0 {
            finish = m.finish_reason;
        }
    }
    assert!(!out.contains("five"), "stop string leaked into the answer");
    assert!(finish == FinishReason::Stop as i32 || finish == FinishReason::Length as i32);

    // The repetition stop: a prompt that loops ends once a run of three words comes round
    // again (shown once), with exact usage; without the rule it runs to max_tokens.
    let looping = GenerateRequest {
        raw_prompt: "red, green, blue, red, green, blue, red, green, blue,".into(),
        max_tokens: 40,
        ..Default::default()
    };
    let (free, free_finish, _) = collect(&mut client, looping.clone()).await;
    assert_eq!(free_finish, FinishReason::Length as i32, "the loop did not loop: {free:?}");
    assert!(models::generate::repeated_run(&free, 3, true).is_some(), "{free:?}");
    let (cut, cut_finish, usage) = collect(&mut client, GenerateRequest { stop_repeated_words: 3, ..looping }).await;
    assert_eq!(cut_finish, FinishReason::Stop as i32, "{cut:?}");
    assert!(free.starts_with(&cut), "greedy either way: {cut:?} / {free:?}");
    let at = models::generate::repeated_run(&cut, 3, true).expect("it stops at a repeat");
    assert!(cut[at..].split_whitespace().count() <= 3, "it went on after the repeat: {cut:?}");
    assert!(usage.completion_tokens < 40 && usage.prompt_tokens > 0, "{usage:?}");
}

/// Text, finish reason and usage of one streamed generation.
async fn collect(
    client: &mut GeneratorClient<tonic::transport::Channel>,
    req: GenerateRequest,
) -> (String, i32, api::v1::Usage) {
    let mut s = client.generate(req).await.unwrap().into_inner();
    let (mut text, mut finish, mut usage) = (String::new(), 0, None);
    while let Some(m) = s.message().await.unwrap() {
        text.push_str(&m.text);
        if m.finish_reason != 0 {
            finish = m.finish_reason;
            usage = m.usage;
        }
    }
    (text, finish, usage.expect("usage on the final message"))
}
