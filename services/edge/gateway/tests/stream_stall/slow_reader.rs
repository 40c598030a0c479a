//! A client that stops reading a streamed answer. The generator here answers without end,
//! 16 KiB a message, a sentence a line (the RAG answer stage streams whole sentences), as
//! fast as it is read; the client reads the first token and then
//! nothing. Once the gateway's buffers are full and the client has taken nothing for the send
//! timeout, the answer is cancelled: the generation ends on the generator (its stream is
//! dropped), the admission place is free, and the client's stream ends in an error, never
//! with the answer's end.

use std::sync::atomic::{AtomicBool, Ordering};

use api::v1::{Document, QueryRequest, embedder_server, rag_client::RagClient};
use gateway::{admission::Admission, http::ConnectionLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long after the client stops reading the answer must be cancelled: the send timeout
/// once the buffers (a few MiB over loopback) are full, with room for a loaded machine.
const BOUND: Duration = Duration::from_secs(30);

/// Sets its flag when dropped: the generator's answer stream ended early.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Answers every request with an endless stream of distinct words, `bytes` a message.
struct Flood {
    cancelled: Arc<AtomicBool>,
    bytes: usize,
}

#[tonic::async_trait]
impl generator_server::Generator for Flood {
    type GenerateStream = Answer;

    async fn generate(&self, _r: Request<GenerateRequest>) -> Result<Response<Answer>, Status> {
        let (guard, bytes) = (Dropped(self.cancelled.clone()), self.bytes);
        let words = futures::stream::unfold((0u64, guard), move |(i, guard)| async move {
            let mut text = String::with_capacity(bytes + 16);
            for j in 0.. {
                if text.len() >= bytes {
                    break;
                }
                text.push_str(&format!("w{i}x{j}.\n"));
            }
            Some((Ok(GenerateResponse { text, ..Default::default() }), (i + 1, guard)))
        });
        Ok(Response::new(Box::pin(words)))
    }
}

/// A pipeline over a flooding generator (and, with `rag`, an embedder and one document);
/// the flag the generator sets when its answer is dropped.
pub(super) async fn flooded_pipeline(rag: bool, dir: &std::path::Path) -> (Arc<Pipeline>, Arc<AtomicBool>) {
    let cancelled = Arc::new(AtomicBool::new(false));
    let flood = Flood { cancelled: cancelled.clone(), bytes: 16 << 10 };
    let mut specs = vec![
        start_backend(Role::Generator, tonic::service::Routes::new(generator_server::GeneratorServer::new(flood)))
            .await,
    ];
    if rag {
        let embedder = tonic::service::Routes::new(embedder_server::EmbedderServer::new(support::ByteStatsEmbedder));
        specs.push(start_backend(Role::Embedder, embedder).await);
    }
    let pool = pool_of(&specs).await;
    let key = docstore::sealing_key(&docstore::KeySource::File(dir.join("sealing.key"))).unwrap();
    let store = docstore::DocStore::open(&dir.join("store"), key).unwrap();
    let chunker = Chunker::load(&minilm(), 200, 40).unwrap();
    // Every line a new sentence of new words: nothing for the answer stage to stop on.
    let settings = Settings { stop_repeated_words: 0, ..Settings::default() };
    let pipeline = Arc::new(Pipeline { pool, store: Arc::new(store), chunker: Arc::new(chunker), settings });
    if rag {
        let mut ingest = pipeline.ingest();
        let doc =
            Document { id: "bees".into(), text: "Bees dance to tell where flowers are.".into(), ..Default::default() };
        ingest.add(doc.into()).await.unwrap();
        ingest.flush().await.unwrap();
    }
    (pipeline, cancelled)
}

/// Waits until the generation was cancelled and the place given back; fails after [`BOUND`].
async fn cancelled_and_freed(cancelled: &AtomicBool, admission: &Admission, what: &str) {
    let t = Instant::now();
    while !(cancelled.load(Ordering::SeqCst) && admission.in_flight() == 0) {
        assert!(
            t.elapsed() < BOUND,
            "{what}: {BOUND:?} after the client stopped reading, the generation was {} and {} place(s) held",
            if cancelled.load(Ordering::SeqCst) { "cancelled" } else { "still running" },
            admission.in_flight()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "{what}: the generation cancelled and the place freed {:?} after the client stopped reading",
        t.elapsed()
    );
}

/// HTTP/1.1: a streamed chat completion whose client reads its first token, then nothing
/// (its receive buffer 4 KiB). The answer is cancelled, the place freed, the connection
/// closed by the gateway, and what the client reads after never ends in `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_streamed_chat_answer_loses_it_and_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, cancelled) = flooded_pipeline(false, dir.path()).await;
    let admission = Admission::new(1).with_send_timeout(SEND_TIMEOUT);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let access = Access::new(&AccessConfig { unauthenticated: true, ..AccessConfig::default() }, addr).unwrap();
    let app = gateway::http::router_with(pipeline, server::Metrics::new("gateway"), access, admission.clone());
    let limits = ConnectionLimits { write_timeout: SEND_TIMEOUT, ..ConnectionLimits::default() };
    tokio::spawn(gateway::http::serve(listener, app, limits, std::future::pending()));

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut client = socket.connect(addr).await.unwrap();
    let request = super::streamed_chat(addr, "");
    client.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("w0x0") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(BOUND, client.read(&mut buf)).await.expect("no first token").unwrap();
        assert!(n > 0, "closed before the first token: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&seen));
    assert_eq!(admission.in_flight(), 1, "the answer holds its place while it is read");

    // The client reads nothing more.
    cancelled_and_freed(&cancelled, &admission, "HTTP/1.1").await;
    // The gateway closed the connection: what is left in the buffers, then the end.
    let mut rest = Vec::new();
    let drained = tokio::time::timeout(BOUND, async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => rest.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the connection was still open {BOUND:?} after the answer was cancelled");
    assert!(!String::from_utf8_lossy(&rest).contains("[DONE]"), "a cancelled answer ended as if whole");
}

/// gRPC: a `Query` whose client takes its first events and then stops polling the stream
/// (HTTP/2 flow control stops the gateway's sends). The answer is cancelled and the place
/// freed; when the client reads again it gets what was already on its way, then
/// `DEADLINE_EXCEEDED` saying why, not the answer's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_that_stops_reading_a_query_loses_it_and_its_place() {
    use tokio_stream::wrappers::TcpListenerStream;
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, cancelled) = flooded_pipeline(true, dir.path()).await;
    let admission = Admission::new(1).with_send_timeout(SEND_TIMEOUT);
    let rag =
        gateway::grpc::RagService::new(pipeline, server::Metrics::new("gateway")).with_admission(admission.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grpc = tonic::transport::Server::builder().add_service(rag.into_server());
    tokio::spawn(grpc.serve_with_incoming(TcpListenerStream::new(listener)));
    let mut client = RagClient::connect(format!("http://{addr}")).await.unwrap();
    let question = QueryRequest { question: "What do bees do?".into(), top_k: 1, ..Default::default() };
    let mut answer = client.query(question).await.expect("the query is admitted").into_inner();
    let mut texts = 0;
    while texts == 0 {
        let event = tokio::time::timeout(BOUND, answer.message()).await.expect("no first event").unwrap();
        let event = event.expect("the answer ended at once").event;
        texts += usize::from(matches!(event, Some(api::v1::query_response::Event::Text(_))));
    }
    assert_eq!(admission.in_flight(), 1, "the answer holds its place while it is read");

    cancelled_and_freed(&cancelled, &admission, "gRPC").await;
    let end = tokio::time::timeout(BOUND, async {
        loop {
            match answer.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the cancelled answer never ended");
    let status = end.expect("a cancelled answer ended as if whole");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("read nothing"), "{}", status.message());
}
