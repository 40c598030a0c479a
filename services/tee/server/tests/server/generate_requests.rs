//! What a Generate client sees for a request the service refuses: the gRPC code and the
//! whole message, one request per rule, against a running service (in process, on
//! loopback). Clients and the gateway's tests match these messages, so they are pinned
//! here word for word; a request within every limit is served.

use std::sync::Arc;

use api::v1::{ChatMessage, GenerateRequest, generator_client::GeneratorClient};
use protocol::SealedExecutor;
use server::{
    Health, Limits, Metrics,
    generator::GeneratorService,
    serve::{ServeOptions, Transport, serve},
};
use tokio::net::TcpListener;
use tonic::{Code, transport::Channel};

use crate::model;

/// A generator service (the tiny Qwen3: a 4096-token context) on loopback with `limits`.
/// The server stops when the returned sender is dropped.
async fn start(limits: Limits) -> (Channel, tokio::sync::oneshot::Sender<()>) {
    let exec = Arc::new(SealedExecutor::new());
    let generator = Arc::new(models::load_generator(&model("tiny/qwen3-tiny"), exec, &Default::default()).unwrap());
    assert_eq!(generator.context_limit(), 4096, "fixture assumption");
    let (metrics, health) = (Metrics::new("generator"), Health::new());
    let svc = GeneratorService::new(generator, limits, metrics.clone(), Arc::new(|| 0.0), health.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let opts = ServeOptions { listener, transport: Transport::Insecure, metrics_listener: None, metrics };
    let routes = tonic::service::Routes::new(svc.into_server());
    tokio::spawn(async move {
        serve(opts, routes, health, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap(), stop)
}

fn user(content: &str) -> Vec<ChatMessage> {
    vec![ChatMessage { role: "user".into(), content: content.into() }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refused_request_gets_invalid_argument_and_its_message() {
    let limits =
        Limits { max_prompt_tokens: Some(32), max_output_tokens: 4096, max_stop_strings: 2, ..Default::default() };
    let (ch, _stop) = start(limits).await;
    let mut c = GeneratorClient::new(ch);
    let base = GenerateRequest { messages: user("Say hello."), max_tokens: 4, ..Default::default() };
    let wizard = vec![ChatMessage { role: "wizard".into(), content: "hi".into() }];
    let blank = vec![
        ChatMessage { role: "system".into(), content: " ".into() },
        ChatMessage { role: "user".into(), content: "\n".into() },
    ];
    let cases: Vec<(GenerateRequest, &str)> = vec![
        (GenerateRequest { messages: vec![], ..base.clone() }, "messages is empty (or set raw_prompt)"),
        (GenerateRequest { messages: wizard, ..base.clone() }, "messages[0].role must be system, user or assistant"),
        (GenerateRequest { messages: blank, ..base.clone() }, "every message is empty"),
        (GenerateRequest { max_tokens: 5000, ..base.clone() }, "max_tokens: 5000 exceeds the limit of 4096"),
        (
            GenerateRequest { stop: vec!["a".into(), "b".into(), "c".into()], ..base.clone() },
            "stop strings: 3 exceeds the limit of 2",
        ),
        (GenerateRequest { stop: vec!["x".repeat(257)], ..base.clone() }, "a stop string is longer than 256 bytes"),
        (GenerateRequest { temperature: 9.0, ..base.clone() }, "invalid request: temperature must be within 0..=5"),
        (GenerateRequest { top_p: 1.5, ..base.clone() }, "invalid request: top_p must be within 0..=1"),
        (
            GenerateRequest { repetition_penalty: 11.0, ..base.clone() },
            "invalid request: repetition_penalty must be within 0..=10",
        ),
        (
            GenerateRequest { stop_repeated_words: 1, ..base.clone() },
            "stop_repeated_words must be 0 (off) or 2 to 64, got 1",
        ),
        (
            GenerateRequest { stop_repeated_words: 65, ..base.clone() },
            "stop_repeated_words must be 0 (off) or 2 to 64, got 65",
        ),
    ];
    for (req, want) in cases {
        let s = c.generate(req).await.expect_err(want);
        assert_eq!((s.code(), s.message()), (Code::InvalidArgument, want));
    }
    // Counted after tokenizing: the counts depend on the tokenizer, the words do not.
    let long = GenerateRequest { raw_prompt: "one, two, three, ".repeat(20), ..base.clone() };
    let s = c.generate(long).await.expect_err("a prompt over 32 tokens");
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    assert!(s.message().starts_with("prompt tokens: ") && s.message().ends_with(" exceeds the limit of 32"), "{s:?}");
    let full = GenerateRequest { max_tokens: 4096, ..base.clone() };
    let s = c.generate(full).await.expect_err("prompt and output over the context");
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    assert!(
        s.message().starts_with("prompt tokens + max_tokens: ") && s.message().ends_with(" exceeds the limit of 4096"),
        "{s:?}"
    );
    // The first rule broken is the one named.
    let both = GenerateRequest { messages: vec![], max_tokens: 5000, temperature: 9.0, ..base.clone() };
    assert_eq!(c.generate(both).await.unwrap_err().message(), "messages is empty (or set raw_prompt)");

    // Within every limit (max_tokens 0: the default), with an empty stop string: served.
    let ok = GenerateRequest { max_tokens: 0, stop: vec![String::new(), "zzz".into()], ..base.clone() };
    let mut s = c.generate(ok).await.unwrap().into_inner();
    let mut usage = None;
    while let Some(m) = s.message().await.unwrap() {
        usage = m.usage.or(usage);
    }
    let usage = usage.expect("the last message carries usage");
    assert!(usage.prompt_tokens > 0 && usage.completion_tokens >= 1, "{usage:?}");
    let raw = GenerateRequest { raw_prompt: "1, 2, 3,".into(), messages: vec![], max_tokens: 2, ..Default::default() };
    let mut s = c.generate(raw).await.unwrap().into_inner();
    while s.message().await.unwrap().is_some() {}
}
