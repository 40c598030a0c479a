//! Request latency on `/metrics`: histograms by method and status code, and a Generate
//! stream's latency runs until its last message, not until the call returned the stream.

use std::time::{Duration, Instant};

use api::v1::{GenerateRequest, generator_client::GeneratorClient};
use tonic::Code;

use crate::support::*;

/// `count` and `sum` of the Generate latency histogram for one status code.
async fn generate_latency(p: &Proc, code: &str) -> (f64, f64) {
    let labels = format!(r#"{{role="generator",method="Generate",code="{code}"}}"#);
    let count = p.metric(&format!("gelo_request_seconds_count{labels}"), "").await;
    let sum = p.metric(&format!("gelo_request_seconds_sum{labels}"), "").await;
    (count, sum)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_is_by_method_and_code_and_covers_the_whole_generate_stream() {
    let path = model("smollm2-135m-instruct.gguf");
    let p = Proc::start(
        "generator-metrics",
        &["generator", "--model", path.to_str().unwrap(), "--metrics-listen", "127.0.0.1:0"],
        &[],
    );
    let mut c = GeneratorClient::new(connect(&p, None).await.channel());

    // Refused: its own series.
    let err = c
        .generate(GenerateRequest { raw_prompt: "x".into(), temperature: 9.0, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // Served: 40 tokens, streamed.
    let req = GenerateRequest { raw_prompt: "1, 2, 3, 4, 5,".into(), max_tokens: 40, ..Default::default() };
    let t = Instant::now();
    let mut s = c.generate(req.clone()).await.unwrap().into_inner();
    let (mut first, mut last) = (None, Duration::ZERO);
    while let Some(_m) = s.message().await.unwrap() {
        first.get_or_insert(t.elapsed());
        last = t.elapsed();
    }
    let streamed = (last - first.unwrap()).as_secs_f64();
    assert!(streamed > 0.05, "40 tokens streamed within {streamed}s: nothing to measure");

    // Cancelled: the client drops the stream after its first chunk.
    let mut s = c.generate(GenerateRequest { max_tokens: 400, ..req }).await.unwrap().into_inner();
    s.message().await.unwrap().expect("a first chunk");
    drop(s);

    let mut cancelled = 0.0;
    for _ in 0..100 {
        cancelled = generate_latency(&p, "Cancelled").await.0;
        if cancelled > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cancelled, 1.0, "the dropped stream was not recorded as Cancelled");
    let (ok, ok_seconds) = generate_latency(&p, "Ok").await;
    assert_eq!(ok, 1.0);
    assert!(
        ok_seconds >= streamed,
        "Generate latency {ok_seconds}s ends before its stream did ({streamed}s between first and last chunk)"
    );
    assert_eq!(generate_latency(&p, "InvalidArgument").await.0, 1.0);
    let inf = r#"gelo_request_seconds_bucket{role="generator",le="+Inf",method="Generate",code="Ok"}"#;
    assert_eq!(p.metric(inf, "").await, 1.0, "buckets are labelled by method and code");
    let requests = r#"gelo_requests_total{role="generator",method="Generate",code="Ok"}"#;
    assert_eq!(p.metric(requests, "").await, 1.0);
}
