//! Every bad input against the running servers: the right status, the limit named, the
//! server healthy afterwards, and no request text in the logs.

use std::time::{Duration, Instant};

use api::v1::{
    ChatMessage, EmbedRequest, GenerateRequest, RerankRequest, embedder_client::EmbedderClient,
    generator_client::GeneratorClient, reranker_client::RerankerClient,
};
use tonic::{Code, codec::Codec};

use crate::support::*;

const MARKER: &str = "ZEBRA-SECRET-4471";

/// Sends raw protobuf bytes to a unary method (to deliver what a typed client cannot,
/// such as invalid UTF-8 in a string field).
#[derive(Clone, Default)]
struct RawCodec;

struct RawEnc;
struct RawDec;

impl tonic::codec::Encoder for RawEnc {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEnc;
    type Decoder = RawDec;
    fn encoder(&mut self) -> RawEnc {
        RawEnc
    }
    fn decoder(&mut self) -> RawDec {
        RawDec
    }
}

async fn raw_embed(channel: tonic::transport::Channel, body: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/gelo.v1.Embedder/Embed");
    grpc.unary(tonic::Request::new(body), path, RawCodec).await.expect_err("must be refused")
}

fn expect(code: Code, r: Result<impl std::fmt::Debug, tonic::Status>, needle: &str) {
    match r {
        Ok(v) => panic!("expected {code:?}, got {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), code, "{}", s.message());
            assert!(s.message().contains(needle), "message {:?} should mention {needle:?}", s.message());
        }
    }
}

async fn healthy(p: &Proc) {
    let ch = connect(p, None).await;
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch.channel());
    let r = h.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    assert_eq!(r.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedder_refuses_bad_input_and_stays_healthy() {
    let path = model("all-minilm-l6-v2");
    let mut p = Proc::start(
        "embedder-bad",
        &[
            "embedder",
            "--model",
            path.to_str().unwrap(),
            "--max-texts",
            "4",
            "--max-queue",
            "1",
            "--max-request-bytes",
            "65536",
        ],
        &[],
    );
    let ch = connect(&p, None).await;
    let mut c = EmbedderClient::new(ch.channel());
    let req = |texts: Vec<String>| EmbedRequest { texts, ..Default::default() };
    expect(Code::InvalidArgument, c.embed(req(vec![])).await, "texts is empty");
    expect(Code::InvalidArgument, c.embed(req(vec!["a".into(); 5])).await, "limit of 4");
    expect(Code::InvalidArgument, c.embed(req(vec!["ok".into(), "  ".into()])).await, "texts[1] is empty");
    let long = format!("{MARKER} {}", "word ".repeat(300));
    expect(Code::InvalidArgument, c.embed(req(vec![long.clone()])).await, "limit of 256");
    let truncated = c.embed(EmbedRequest { texts: vec![long], truncate: true, ..Default::default() }).await.unwrap();
    assert_eq!(truncated.into_inner().embeddings[0].values.len(), 384);
    expect(
        Code::InvalidArgument,
        c.embed(EmbedRequest { texts: vec!["x".into()], instruction: "find".into(), ..Default::default() }).await,
        "no instruction",
    );
    // Over the request size limit: RESOURCE_EXHAUSTED, limit named.
    expect(Code::ResourceExhausted, c.embed(req(vec!["y".repeat(70_000)])).await, "65536");
    // Invalid UTF-8 in `texts` (field 1, length-delimited): INVALID_ARGUMENT.
    let status = raw_embed(ch.channel(), vec![0x0a, 0x03, 0xff, 0xfe, 0x41]).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(status.message().contains("UTF-8"), "{}", status.message());
    // A full queue: RESOURCE_EXHAUSTED, limit named (queue of 1, 24 concurrent requests).
    let mut tasks = Vec::new();
    for i in 0..24 {
        let mut c = c.clone();
        let texts: Vec<String> =
            (0..4).map(|j| format!("{MARKER} request {i} text {j} {}", "lorem ipsum ".repeat(40))).collect();
        tasks.push(tokio::spawn(async move { c.embed(req(texts)).await.map(|_| ()) }));
    }
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => {}
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{}", s.message());
                assert!(s.message().contains("limit 1"), "{}", s.message());
                refused += 1;
            }
        }
    }
    assert!(refused > 0 && refused < 24, "refused {refused} of 24");
    healthy(&p).await;
    assert!(p.alive());
    let log = p.log_text();
    assert!(!log.contains(MARKER) && !log.contains("lorem"), "request text leaked into the log");
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generator_refuses_bad_input_frees_cancelled_sequences_and_stays_healthy() {
    let path = model("smollm2-135m-instruct.gguf");
    let mut p = Proc::start(
        "generator-bad",
        &[
            "generator",
            "--model",
            path.to_str().unwrap(),
            "--max-output-tokens",
            "512",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let ch = connect(&p, None).await;
    let mut c = GeneratorClient::new(ch.channel());
    let user = |content: &str| vec![ChatMessage { role: "user".into(), content: content.into() }];
    let base = GenerateRequest { messages: user(MARKER), max_tokens: 8, ..Default::default() };
    expect(
        Code::InvalidArgument,
        c.generate(GenerateRequest { messages: vec![], ..base.clone() }).await,
        "messages is empty",
    );
    let wizard = vec![ChatMessage { role: "wizard".into(), content: MARKER.into() }];
    expect(Code::InvalidArgument, c.generate(GenerateRequest { messages: wizard, ..base.clone() }).await, "role");
    expect(
        Code::InvalidArgument,
        c.generate(GenerateRequest { temperature: 9.0, ..base.clone() }).await,
        "temperature",
    );
    expect(Code::InvalidArgument, c.generate(GenerateRequest { top_p: 1.5, ..base.clone() }).await, "top_p");
    expect(
        Code::InvalidArgument,
        c.generate(GenerateRequest { max_tokens: 5000, ..base.clone() }).await,
        "limit of 512",
    );
    expect(
        Code::InvalidArgument,
        c.generate(GenerateRequest { stop: vec!["s".into(); 17], ..base.clone() }).await,
        "limit of 16",
    );
    expect(
        Code::InvalidArgument,
        c.generate(GenerateRequest { stop_repeated_words: 1, ..base.clone() }).await,
        "stop_repeated_words",
    );
    expect(
        Code::InvalidArgument,
        c.generate(GenerateRequest { stop_repeated_words: 65, ..base.clone() }).await,
        "stop_repeated_words",
    );
    let huge = GenerateRequest { raw_prompt: format!("{MARKER} {}", "word ".repeat(9000)), ..base.clone() };
    expect(Code::InvalidArgument, c.generate(huge).await, "8192");

    // Cancellation: drop a running stream; its sequence (and KV cache) leaves the batch.
    let long = GenerateRequest { raw_prompt: format!("{MARKER} 1, 2, 3,"), max_tokens: 400, ..Default::default() };
    let mut s = c.generate(long.clone()).await.unwrap().into_inner();
    for _ in 0..3 {
        let m = s.message().await.unwrap().expect("a running stream");
        assert_eq!(m.finish_reason, 0, "the counting prompt should not stop this early");
    }
    let mut running = false;
    for _ in 0..50 {
        if p.metric("gelo_active_sequences", "generator").await >= 1.0 {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(running, "the sequence never showed as active");
    drop(s);
    wait_for_zero(&p).await;
    // A deadline the server must enforce itself: the client sets only the grpc-timeout
    // header (no client-side timeout) and keeps reading, and tonic's own server timeout ends
    // when the handler returns the stream. So the stream can only end in DEADLINE_EXCEEDED
    // with the scheduler's reason, and the sequence leaves the batch while the client still
    // holds the stream open.
    let deadline = Duration::from_millis(500);
    let mut r = tonic::Request::new(long);
    r.set_timeout(deadline);
    let t = Instant::now();
    let mut s = c.generate(r).await.expect("the stream opens well within its deadline").into_inner();
    let err = loop {
        match s.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("400 tokens finished within the {deadline:?} deadline"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("deadline passed"), "not the server's own expiry: {err:?}");
    assert!(t.elapsed() >= deadline, "expired after {:?}", t.elapsed());
    wait_for_zero(&p).await;
    drop(s);
    healthy(&p).await;
    assert!(p.alive());
    let log = p.log_text();
    assert!(!log.contains(MARKER), "prompt text leaked into the log");
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reranker_refuses_bad_input_and_stays_healthy() {
    let path = model("smollm2-135m-instruct.gguf");
    let mut p =
        Proc::start("reranker-bad", &["reranker", "--model", path.to_str().unwrap(), "--max-documents", "4"], &[]);
    let ch = connect(&p, None).await;
    let mut c = RerankerClient::new(ch.channel());
    let doc = |i: usize| format!("{MARKER} document {i} about rivers");
    let req =
        |query: &str, documents: Vec<String>| RerankRequest { query: query.into(), documents, ..Default::default() };
    expect(Code::InvalidArgument, c.rerank(req("", vec![doc(0)])).await, "query is empty");
    expect(Code::InvalidArgument, c.rerank(req(" \n ", vec![doc(0)])).await, "query is empty");
    expect(Code::InvalidArgument, c.rerank(req(MARKER, vec![])).await, "documents is empty");
    expect(
        Code::InvalidArgument,
        c.rerank(req(MARKER, (0..5).map(doc).collect())).await,
        "documents per request: 5 exceeds the limit of 4",
    );
    expect(Code::InvalidArgument, c.rerank(req(MARKER, vec![doc(0), "  ".into()])).await, "documents[1] is empty");
    // A (query, document) pair over the model's input length: the document and the limit named.
    let long = format!("{MARKER} {}", "word ".repeat(9000));
    let over = c.rerank(req(MARKER, vec![doc(0), long])).await;
    expect(Code::InvalidArgument, over, "documents[1] tokens with the query");
    // Still serving, and correctly: a good request right after.
    let ok = c.rerank(req("Which river?", vec![doc(0), doc(1)])).await.unwrap().into_inner();
    assert_eq!(ok.results.len(), 2);
    healthy(&p).await;
    assert!(p.alive());
    let log = p.log_text();
    assert!(
        !log.contains(MARKER) && !log.contains("word word") && !log.contains("rivers"),
        "request text leaked into the log"
    );
    assert!(!log.contains("panicked"), "{log}");
}

async fn wait_for_zero(p: &Proc) {
    for _ in 0..100 {
        if p.metric("gelo_active_sequences", "generator").await == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("a cancelled sequence stayed in the decode batch");
}
