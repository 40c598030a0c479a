//! Clients of a running gateway: `gelo ingest|query|search`, and `gelo rag ...` (the same plus
//! delete, stats, a BEIR evaluation through the gateway and the RAG benchmark).
//!
//! The connection is RA-TLS: the gateway's evidence must satisfy a policy, carry the
//! expected model identity and the role `gateway`, and answer a fresh nonce. Without flags
//! the commands use the gateway `gelo up` started (its state file names address, policy and
//! identity).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use api::v1::{
    Chunking, DeleteRequest, Document, IngestSummary, QueryRequest, SearchRequest, StageTimings, StatsRequest,
    query_response::Event, rag_client::RagClient,
};
use attest::Policy;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::up::{UpState, state_file};

mod measure;
pub use measure::{BenchArgs, EvalArgs};
use measure::{bench, eval};

#[derive(clap::Subcommand)]
pub enum RagCommand {
    /// Ingest files (.txt, .md, .jsonl incl. BEIR corpora) or --text into the gateway's store.
    Ingest(IngestArgs),
    /// Ask a question: streams the answer, then the passages it cites.
    Query(QueryArgs),
    /// Retrieve (and rerank) passages.
    Search(SearchArgs),
    /// Delete documents by id.
    Delete(DeleteArgs),
    /// Store size and every backend's verification state.
    Stats(StatsArgs),
    /// Verify the gateway (policy, model, role, the backend policy it attests, a fresh
    /// nonce) and print what it proved: the check to run before pointing an OpenAI client
    /// at its HTTP port.
    Verify(StatsArgs),
    /// nDCG@10 / Recall@100 of retrieval through the gateway on a BEIR dataset.
    Eval(EvalArgs),
    /// Ingest throughput and query latency (p50/p95) at several concurrencies, per stage.
    Bench(BenchArgs),
}

pub fn run(cmd: RagCommand) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match cmd {
            RagCommand::Ingest(a) => ingest(a).await,
            RagCommand::Query(a) => query(a).await,
            RagCommand::Search(a) => search(a).await,
            RagCommand::Delete(a) => delete(a).await,
            RagCommand::Stats(a) => stats(a).await,
            RagCommand::Verify(a) => verify(a).await,
            RagCommand::Eval(a) => eval(a).await,
            RagCommand::Bench(a) => bench(a).await,
        }
    })
}

// ---------------------------------------------------------------------------------------
// Connecting

#[derive(clap::Args, Clone, Debug)]
pub struct Conn {
    /// Gateway gRPC address (default: the gateway `gelo up` runs).
    #[arg(long, env = "GELO_GATEWAY")]
    pub gateway: Option<String>,
    /// Attestation policy the gateway's evidence must satisfy.
    #[arg(long, env = "GELO_GATEWAY_POLICY")]
    pub policy: Option<PathBuf>,
    /// Model identity (64 hex) the gateway must prove: the identity of its tokenizer model.
    #[arg(long, env = "GELO_GATEWAY_IDENTITY")]
    pub expect_identity: Option<String>,
    /// The policy the gateway must attest it verifies backends with (its digest is in the
    /// gateway's attested scheme). Default: the policy the gateway itself is verified with.
    #[arg(long, env = "GELO_GATEWAY_BACKEND_POLICY")]
    pub backend_policy: Option<PathBuf>,
    /// Plaintext gRPC, for a gateway started with --insecure. Nothing is verified.
    #[arg(long)]
    pub insecure: bool,
    /// `gelo up`'s state folder (default `${GELO_CACHE:-~/.cache/gelo}/up`).
    #[arg(long, env = "GELO_UP_DIR")]
    pub state_dir: Option<PathBuf>,
}

impl Conn {
    pub async fn connect(&self) -> Result<RagClient<Channel>> {
        if self.insecure {
            let gateway = self.gateway()?;
            let ch = Channel::from_shared(format!("http://{gateway}"))?
                .connect()
                .await
                .with_context(|| format!("connecting to {gateway}"))?;
            return Ok(client(ch));
        }
        Ok(client(self.verify().await?.channel.channel()))
    }

    fn gateway(&self) -> Result<String> {
        match &self.gateway {
            Some(g) => Ok(g.clone()),
            None => UpState::read(&state_file(self.state_dir.as_deref()))
                .map(|u| u.grpc)
                .map_err(|_| anyhow!("no gateway: pass --gateway, or start a local pipeline with `gelo up`")),
        }
    }

    /// The gateway to talk to and what it must prove: the flags, else what `gelo up`
    /// wrote in its state file.
    pub fn target(&self) -> Result<proxy::GatewayTarget> {
        let up = UpState::read(&state_file(self.state_dir.as_deref())).ok();
        let from_up = |what: &str| anyhow!("no {what}: pass --{what}, or start a local pipeline with `gelo up`");
        let address = self.gateway()?;
        let policy_file = match (&self.policy, &up) {
            (Some(p), _) => p.clone(),
            (None, Some(u)) => u.policy.clone(),
            (None, None) => return Err(from_up("policy")),
        };
        let identity = match (&self.expect_identity, &up) {
            (Some(i), _) => Some(i.clone()),
            (None, Some(u)) => Some(u.identity.clone()),
            (None, None) => None,
        };
        let model_identity = identity
            .map(|s| -> Result<[u8; 32]> {
                let mut out = [0u8; 32];
                hex::decode_to_slice(s.trim(), &mut out).context("--expect-identity: expected 64 hex digits")?;
                Ok(out)
            })
            .transpose()?;
        let policy = Policy::from_file(&policy_file).with_context(|| format!("policy {}", policy_file.display()))?;
        let trusts_file = self.backend_policy.as_ref().unwrap_or(&policy_file);
        let trusts = match &self.backend_policy {
            Some(p) => Policy::from_file(p).with_context(|| format!("backend policy {}", p.display()))?,
            None => policy.clone(),
        };
        let backend_policy = trusts.digest().with_context(|| format!("backend policy {}", trusts_file.display()))?;
        Ok(proxy::GatewayTarget {
            address,
            policy: Arc::new(policy),
            model_identity,
            backend_policy,
            backend_policy_name: trusts_file.display().to_string(),
        })
    }

    /// Connects over RA-TLS and checks everything the gateway must prove
    /// ([`proxy::verify_gateway`]: evidence, role, backend policy, fresh nonce); returns
    /// what it proved with the channel.
    pub async fn verify(&self) -> Result<proxy::VerifiedGateway> {
        let target = self.target()?;
        proxy::verify_gateway(&target).await.with_context(|| format!("the gateway at {}", target.address))
    }
}

fn client(ch: Channel) -> RagClient<Channel> {
    RagClient::new(ch).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20)
}

pub(super) fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow!("{:?}: {}", s.code(), s.message())
}

// ---------------------------------------------------------------------------------------
// Reading documents

/// One input document.
pub(super) fn doc(
    id: String,
    title: String,
    text: String,
    metadata: BTreeMap<String, String>,
    whole: bool,
) -> Document {
    Document {
        id,
        title,
        text,
        metadata: metadata.into_iter().collect(),
        chunking: if whole { Chunking::Whole } else { Chunking::Tokens } as i32,
    }
}

fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            let nested: Vec<PathBuf> = entries
                .into_iter()
                .filter(|e| e.is_dir() || matches!(ext(e).as_str(), "txt" | "md" | "markdown" | "jsonl"))
                .collect();
            out.extend(files(&nested)?);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            bail!("{} does not exist", p.display());
        }
    }
    Ok(out)
}

fn ext(p: &Path) -> String {
    p.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase()
}

fn json_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Documents of one JSON Lines record: `_id`/`id`, `title`, `text`/`contents`, `metadata`.
pub(super) fn jsonl_doc(path: &Path, line_no: usize, line: &str, whole: bool) -> Result<Document> {
    let v: Value = serde_json::from_str(line).with_context(|| format!("{}:{line_no}: not JSON", path.display()))?;
    let id = v
        .get("_id")
        .or_else(|| v.get("id"))
        .and_then(json_string)
        .with_context(|| format!("{}:{line_no}: no `_id` or `id`", path.display()))?;
    let title = v.get("title").and_then(json_string).unwrap_or_default();
    let text = v
        .get("text")
        .or_else(|| v.get("contents"))
        .and_then(json_string)
        .with_context(|| format!("{}:{line_no}: no `text`", path.display()))?;
    let mut metadata = BTreeMap::new();
    if let Some(Value::Object(m)) = v.get("metadata") {
        for (k, v) in m {
            metadata.insert(k.clone(), json_string(v).unwrap_or_else(|| v.to_string()));
        }
    }
    Ok(doc(id, title, text, metadata, whole))
}

/// Reads every input into documents, sending them as they are read.
fn read_inputs(a: &IngestArgs, tx: tokio::sync::mpsc::Sender<Document>, bar: ProgressBar) -> Result<()> {
    for (i, text) in a.text.iter().enumerate() {
        let id = match (&a.id, a.text.len()) {
            (Some(id), 1) => id.clone(),
            (Some(id), _) => format!("{id}-{i}"),
            (None, _) => format!("text-{}", &hex::encode(sha256(text.as_bytes()))[..16]),
        };
        let d = doc(id, a.title.clone().unwrap_or_default(), text.clone(), BTreeMap::new(), a.whole);
        bar.inc(text.len() as u64);
        tx.blocking_send(d).map_err(|_| anyhow!("the gateway stopped reading"))?;
    }
    for path in files(&a.paths)? {
        match ext(&path).as_str() {
            "jsonl" => {
                let f = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
                for (n, line) in BufReader::new(f).lines().enumerate() {
                    let line = line.with_context(|| format!("reading {}", path.display()))?;
                    bar.inc(line.len() as u64 + 1);
                    if line.trim().is_empty() {
                        continue;
                    }
                    let d = jsonl_doc(&path, n + 1, &line, a.whole)?;
                    tx.blocking_send(d).map_err(|_| anyhow!("the gateway stopped reading"))?;
                }
            }
            _ => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {} (UTF-8 text)", path.display()))?;
                bar.inc(text.len() as u64);
                let heading = text.lines().find_map(|l| l.strip_prefix("# ")).map(|h| h.trim().to_string());
                let title = heading
                    .unwrap_or_else(|| path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string());
                let d = doc(path.display().to_string(), title, text, BTreeMap::new(), a.whole);
                tx.blocking_send(d).map_err(|_| anyhow!("the gateway stopped reading"))?;
            }
        }
    }
    Ok(())
}

fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}

// ---------------------------------------------------------------------------------------
// ingest

#[derive(clap::Args, Clone, Debug)]
pub struct IngestArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Files or folders: .txt and .md (one document each; id = path), .jsonl (one document
    /// per line: `_id` or `id`, `title`, `text`, optional `metadata`; BEIR corpora as they are).
    pub paths: Vec<PathBuf>,
    /// A document's text (repeatable).
    #[arg(long)]
    pub text: Vec<String>,
    /// Id of the --text document (default: a hash of its text).
    #[arg(long)]
    pub id: Option<String>,
    /// Title of the --text documents.
    #[arg(long)]
    pub title: Option<String>,
    /// One passage per document, embedded truncated to the embedder's maximum (as BEIR
    /// evaluations do), instead of overlapping token windows.
    #[arg(long)]
    pub whole: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

async fn ingest(a: IngestArgs) -> Result<()> {
    if a.paths.is_empty() && a.text.is_empty() {
        bail!("nothing to ingest: give files, folders or --text");
    }
    let mut client = a.conn.connect().await?;
    let total: u64 = a.text.iter().map(|t| t.len() as u64).sum::<u64>()
        + files(&a.paths)?.iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len())).sum::<u64>();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} ingesting {bytes}/{total_bytes} [{bar:30}] {elapsed} {msg}")?
            .progress_chars("=> "),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let reader = {
        let (a, bar) = (a.clone(), bar.clone());
        tokio::task::spawn_blocking(move || read_inputs(&a, tx, bar))
    };
    let t = Instant::now();
    let sent = client.ingest(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
    let read = reader.await?;
    bar.finish_and_clear();
    read?;
    let summary = sent.map_err(status_error)?.into_inner();
    print_summary(&summary, t.elapsed(), a.json);
    Ok(())
}

fn print_summary(s: &IngestSummary, took: Duration, as_json: bool) {
    if as_json {
        let skipped: Vec<Value> = s.skipped.iter().map(|k| json!({ "id": k.id, "reason": k.reason })).collect();
        println!(
            "{}",
            json!({ "documents": s.documents, "chunks": s.chunks, "skipped": skipped, "seconds": took.as_secs_f64() })
        );
        return;
    }
    println!("ingested {} documents ({} passages) in {:.1} s", s.documents, s.chunks, took.as_secs_f64());
    for k in &s.skipped {
        println!("  skipped {:?}: {}", k.id, k.reason);
    }
}

// ---------------------------------------------------------------------------------------
// query, search

#[derive(clap::Args, Clone, Debug)]
pub struct QueryArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub question: String,
    /// Passages to answer from (0: the gateway's default).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Answer tokens (0: the gateway's default).
    #[arg(long, default_value_t = 0)]
    pub max_tokens: u32,
    /// 0: greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Rerank the candidates (default: the gateway's setting).
    #[arg(long, action = clap::ArgAction::Set)]
    pub rerank: Option<bool>,
    /// Print every event as a JSON line.
    #[arg(long)]
    pub json: bool,
}

async fn query(a: QueryArgs) -> Result<()> {
    let mut client = a.conn.connect().await?;
    let req = QueryRequest {
        question: a.question.clone(),
        top_k: a.top_k,
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        seed: a.seed,
        rerank: a.rerank,
    };
    let mut stream = client.query(req).await.map_err(status_error)?.into_inner();
    let mut passages = Vec::new();
    let mut cited = Vec::new();
    let mut out = std::io::stdout();
    while let Some(msg) = stream.message().await.map_err(status_error)? {
        let Some(event) = msg.event else { continue };
        if a.json {
            println!("{}", event_json(&event));
            continue;
        }
        match event {
            Event::Passages(p) => passages = p.passages,
            Event::Text(t) => {
                out.write_all(t.as_bytes())?;
                out.flush()?;
            }
            Event::Citations(c) => {
                cited = c.passage_ids;
                if !c.unknown.is_empty() {
                    eprintln!("\nwarning: the answer cites ids that were not retrieved: {}", c.unknown.join(", "));
                }
            }
            Event::Usage(_) | Event::Timings(_) => {}
        }
    }
    if !a.json {
        println!("\n\nSources:");
        for p in &passages {
            let mark = if cited.contains(&p.passage_id) { "cited" } else { "     " };
            let rerank = p.rerank_score.map_or(String::new(), |r| format!(", rerank {r:.3}"));
            println!("  {mark} [{}] {} (score {:.3}{rerank})", p.passage_id, p.title, p.score);
        }
    }
    Ok(())
}

fn passage_json(p: &api::v1::Passage) -> Value {
    json!({
        "passage_id": p.passage_id, "document_id": p.document_id, "title": p.title, "text": p.text,
        "score": p.score, "rerank_score": p.rerank_score, "metadata": p.metadata,
    })
}

fn timings_json(t: &StageTimings) -> Value {
    json!({
        "embed_seconds": t.embed_seconds, "search_seconds": t.search_seconds, "rerank_seconds": t.rerank_seconds,
        "generate_seconds": t.generate_seconds, "first_token_seconds": t.first_token_seconds,
    })
}

fn event_json(e: &Event) -> Value {
    match e {
        Event::Passages(p) => json!({ "passages": p.passages.iter().map(passage_json).collect::<Vec<_>>() }),
        Event::Text(t) => json!({ "text": t }),
        Event::Usage(u) => {
            json!({ "usage": { "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens } })
        }
        Event::Citations(c) => json!({ "citations": c.passage_ids, "unknown_citations": c.unknown }),
        Event::Timings(t) => json!({ "timings": timings_json(t) }),
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct SearchArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub query: String,
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    #[arg(long, action = clap::ArgAction::Set)]
    pub rerank: Option<bool>,
    #[arg(long)]
    pub json: bool,
}

async fn search(a: SearchArgs) -> Result<()> {
    let mut client = a.conn.connect().await?;
    let r = client
        .search(SearchRequest { query: a.query.clone(), top_k: a.top_k, rerank: a.rerank })
        .await
        .map_err(status_error)?
        .into_inner();
    if a.json {
        let t = r.timings.as_ref().map(timings_json);
        println!("{}", json!({ "passages": r.passages.iter().map(passage_json).collect::<Vec<_>>(), "timings": t }));
        return Ok(());
    }
    for (i, p) in r.passages.iter().enumerate() {
        let rerank = p.rerank_score.map_or(String::new(), |r| format!(" rerank {r:.3}"));
        let snippet: String = p.text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(160).collect();
        println!("{:>2}. [{}] score {:.3}{rerank}  {}\n    {snippet}", i + 1, p.passage_id, p.score, p.title);
    }
    if r.passages.is_empty() {
        println!("no passages");
    }
    Ok(())
}

#[derive(clap::Args, Clone, Debug)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub conn: Conn,
    #[arg(required = true)]
    pub ids: Vec<String>,
}

async fn delete(a: DeleteArgs) -> Result<()> {
    let mut client = a.conn.connect().await?;
    let r = client.delete(DeleteRequest { ids: a.ids }).await.map_err(status_error)?.into_inner();
    println!("deleted {} documents", r.deleted);
    Ok(())
}

#[derive(clap::Args, Clone, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub conn: Conn,
}

async fn verify(a: StatsArgs) -> Result<()> {
    if a.conn.insecure {
        bail!("--insecure verifies nothing");
    }
    let target = a.conn.target()?;
    let gateway = proxy::verify_gateway(&target).await.with_context(|| format!("the gateway at {}", target.address))?;
    println!("{}", serde_json::to_string_pretty(&gateway.report(&target))?);
    Ok(())
}

async fn stats(a: StatsArgs) -> Result<()> {
    let mut client = a.conn.connect().await?;
    let s = client.stats(StatsRequest {}).await.map_err(status_error)?.into_inner();
    let backends: Vec<Value> = s
        .backends
        .iter()
        .map(|b| {
            json!({
                "role": b.role, "endpoint": b.endpoint, "verified": b.verified, "reason": b.reason,
                "model_identity": b.model_identity, "tls_spki_sha256": b.tls_spki_sha256, "measurement": b.measurement,
                "verified_age_seconds": b.verified_age_seconds, "requests": b.requests,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "documents": s.documents, "chunks": s.chunks, "store_bytes": s.store_bytes, "dimension": s.dimension, "backends": backends,
        }))?
    );
    Ok(())
}
