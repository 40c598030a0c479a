//! Traces over OTLP/gRPC: real service processes export a span per RPC (method, status
//! code, counts) to an in-test collector, and nothing they export carries request text.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use api::v1::{EmbedRequest, GenerateRequest, embedder_client::EmbedderClient, generator_client::GeneratorClient};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{KeyValue, any_value::Value},
    trace::v1::{Span, span::SpanKind},
};
use prost::Message as _;
use tonic::Code;

use crate::support::*;

const MARKER: &str = "OTLP-MARKER-9213";

/// An OTLP trace collector that keeps every export it receives.
#[derive(Clone, Default)]
struct Collector {
    got: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.got.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    async fn start() -> (Collector, SocketAddr) {
        let c = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tonic::transport::Server::builder().add_service(TraceServiceServer::new(c.clone()));
        tokio::spawn(server.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)));
        (c, addr)
    }

    /// The spans exported by `service` (its `service.name`) named `name`, once there are
    /// at least `n` of them.
    async fn wait_for(&self, service: &str, name: &str, n: usize) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans: Vec<Span> = self
                .got
                .lock()
                .unwrap()
                .iter()
                .flat_map(|r| &r.resource_spans)
                .filter(|rs| {
                    rs.resource.as_ref().is_some_and(|r| string_attr(&r.attributes, "service.name") == Some(service))
                })
                .flat_map(|rs| &rs.scope_spans)
                .flat_map(|ss| &ss.spans)
                .filter(|s| s.name == name)
                .cloned()
                .collect();
            if spans.len() >= n {
                return spans;
            }
            assert!(Instant::now() < deadline, "{service}: {} of {n} `{name}` spans arrived", spans.len());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every export received, as the bytes that came over the wire.
    fn wire_bytes(&self) -> Vec<u8> {
        self.got.lock().unwrap().iter().flat_map(|r| r.encode_to_vec()).collect()
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()
}

fn string_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key)? {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

fn int_attr(s: &Span, key: &str) -> i64 {
    match attr(&s.attributes, key) {
        Some(Value::IntValue(v)) => *v,
        other => panic!("span `{}`: attribute {key} is {other:?}", s.name),
    }
}

fn with_code(spans: &[Span], code: Code) -> Vec<&Span> {
    spans.iter().filter(|s| int_attr(s, "rpc.grpc.status_code") == code as i64).collect()
}

fn otlp_env(collector: SocketAddr) -> [(&'static str, String); 2] {
    // A short export interval: the test waits for the batch exporter.
    [("GELO_OTLP_ENDPOINT", format!("http://{collector}")), ("OTEL_BSP_SCHEDULE_DELAY", "100".into())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_export_rpc_spans_over_otlp_without_request_text() {
    let (collector, addr) = Collector::start().await;
    let env = otlp_env(addr);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // The embedder: one request served, two refused.
    let path = model("all-minilm-l6-v2");
    let embedder = Proc::start("embedder-otlp", &["embedder", "--model", path.to_str().unwrap()], &env);
    let mut c = EmbedderClient::new(connect(&embedder, None).await.channel());
    let texts = vec![format!("{MARKER} first text"), format!("{MARKER} second text")];
    c.embed(EmbedRequest { texts: texts.clone(), ..Default::default() }).await.unwrap();
    let refused =
        c.embed(EmbedRequest { texts: vec![MARKER.into(), " ".into()], ..Default::default() }).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let long = format!("{MARKER} {}", "word ".repeat(300));
    assert_eq!(
        c.embed(EmbedRequest { texts: vec![long], ..Default::default() }).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    let spans = collector.wait_for("gelo-embedder", "gelo.v1.Embedder/Embed", 3).await;
    let ok = with_code(&spans, Code::Ok);
    assert_eq!(ok.len(), 1, "{spans:#?}");
    let s = ok[0];
    assert_eq!(s.kind, SpanKind::Server as i32);
    assert_eq!(string_attr(&s.attributes, "rpc.system"), Some("grpc"));
    assert_eq!(string_attr(&s.attributes, "rpc.service"), Some("gelo.v1.Embedder"));
    assert_eq!(string_attr(&s.attributes, "rpc.method"), Some("Embed"));
    assert_eq!(int_attr(s, "gelo.items"), 2);
    assert!(int_attr(s, "gelo.input_tokens") >= 6, "{s:#?}");
    assert!(int_attr(s, "gelo.batch_size") >= 1);
    assert!(s.end_time_unix_nano > s.start_time_unix_nano);
    assert_eq!(with_code(&spans, Code::InvalidArgument).len(), 2, "{spans:#?}");

    // The generator: the span covers the whole stream and counts its tokens.
    let path = model("smollm2-135m-instruct.gguf");
    let generator = Proc::start("generator-otlp", &["generator", "--model", path.to_str().unwrap()], &env);
    let mut g = GeneratorClient::new(connect(&generator, None).await.channel());
    let req = GenerateRequest { raw_prompt: format!("{MARKER} 1, 2, 3,"), max_tokens: 24, ..Default::default() };
    let t = Instant::now();
    let mut stream = g.generate(req).await.unwrap().into_inner();
    let (mut tokens, mut first) = (0, None);
    while let Some(m) = stream.message().await.unwrap() {
        first.get_or_insert(t.elapsed());
        tokens += m.token_ids.len();
    }
    let streamed = t.elapsed() - first.unwrap();
    let spans = collector.wait_for("gelo-generator", "gelo.v1.Generator/Generate", 1).await;
    let s = &spans[0];
    assert_eq!(int_attr(s, "rpc.grpc.status_code"), Code::Ok as i64);
    assert_eq!(int_attr(s, "gelo.output_tokens"), tokens as i64);
    assert!(int_attr(s, "gelo.input_tokens") > 0);
    assert!(int_attr(s, "gelo.batch_size") >= 1);
    let span_time = Duration::from_nanos(s.end_time_unix_nano - s.start_time_unix_nano);
    assert!(span_time >= streamed, "the span ({span_time:?}) ended before the stream did ({streamed:?} of chunks)");

    // Nothing exported — span names, attributes, events, resources — holds request text.
    let wire = collector.wire_bytes();
    assert!(!wire.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()), "request text reached the trace collector");
    assert!(!wire.windows(9).any(|w| w == b"word word"), "request text reached the trace collector");
}
