//! Measurements through a running gateway: `gelo rag eval` (BEIR retrieval quality) and
//! `gelo rag bench` (ingest throughput, query latency and each stage's share).

use std::{
    collections::{BTreeMap, HashSet},
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use api::v1::{Document, QueryRequest, SearchRequest, query_response::Event, rag_client::RagClient};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::{Conn, doc, jsonl_doc, status_error};

// ---------------------------------------------------------------------------------------
// eval: BEIR retrieval through the gateway

#[derive(clap::Args, Clone, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv.
    #[arg(long)]
    pub data: PathBuf,
    /// Only the first N corpus documents plus every judged one (as `gelo eval beir --limit`).
    #[arg(long)]
    pub limit: Option<usize>,
    /// The corpus is already in the store.
    #[arg(long)]
    pub skip_ingest: bool,
    /// Concurrent Search calls.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Also evaluate this embedder in process (masked, CPU engine) on the same documents.
    #[arg(long)]
    pub reference_model: Option<PathBuf>,
}

/// The BEIR corpus with titles and texts apart (the gateway embeds `title + " " + text`, as
/// `models::beir` does), restricted like `gelo eval beir --limit`.
pub fn beir_corpus(
    dir: &Path,
    limit: Option<usize>,
    judged: &HashSet<String>,
) -> Result<Vec<(String, String, String)>> {
    let path = dir.join("corpus.jsonl");
    let f = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let d = jsonl_doc(&path, i + 1, &line, true)?;
        if limit.is_none_or(|l| out.len() < l) || judged.contains(&d.id) {
            out.push((d.id, d.title, d.text));
        }
    }
    Ok(out)
}

pub(super) async fn eval(a: EvalArgs) -> Result<()> {
    let mut data = models::beir::BeirData::load(&a.data)?;
    let judged: HashSet<String> = data.qrels.values().flat_map(|m| m.keys().cloned()).collect();
    let corpus = beir_corpus(&a.data, a.limit, &judged)?;
    let keep: HashSet<&str> = corpus.iter().map(|(id, _, _)| id.as_str()).collect();
    data.corpus.retain(|(id, _)| keep.contains(id.as_str()));
    let mut client = a.conn.connect().await?;

    let t = Instant::now();
    if !a.skip_ingest {
        let bar = ProgressBar::new(corpus.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{spinner} ingesting {pos}/{len} [{bar:30}] {elapsed}")?.progress_chars("=> "),
        );
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let docs: Vec<Document> = corpus
            .iter()
            .map(|(id, title, text)| doc(id.clone(), title.clone(), text.clone(), BTreeMap::new(), true))
            .collect();
        let b = bar.clone();
        tokio::spawn(async move {
            for d in docs {
                if tx.send(d).await.is_err() {
                    break;
                }
                b.inc(1);
            }
        });
        let s =
            client.ingest(tokio_stream::wrappers::ReceiverStream::new(rx)).await.map_err(status_error)?.into_inner();
        bar.finish_and_clear();
        if !s.skipped.is_empty() {
            bail!("{} documents were skipped, e.g. {:?}", s.skipped.len(), s.skipped[0]);
        }
    }
    let ingest_seconds = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let ranked = search_all(&client, &data.queries, 100, a.concurrency.max(1)).await?;
    let query_seconds = t.elapsed().as_secs_f64();
    let (ndcg, recall) = models::beir::metrics(&ranked, &data.qrels);
    let mut out = json!({
        "ndcg_at_10": ndcg, "recall_at_100": recall, "queries": data.queries.len(), "documents": corpus.len(),
        "ingest_seconds": ingest_seconds, "query_seconds": query_seconds,
    });
    if let Some(model) = &a.reference_model {
        let exec = Arc::new(protocol::MaskedExecutor::new(
            Arc::new(kernels::CpuEngine::new()),
            protocol::MaskedConfig::default(),
        )?);
        let e = models::load_embedder(model, exec, &models::LoadOptions::default())?;
        let s =
            tokio::task::spawn_blocking(move || models::beir::evaluate(e.as_ref(), &data, 32, |_, _, _| {})).await??;
        out["reference"] = json!({ "ndcg_at_10": s.ndcg_at_10, "recall_at_100": s.recall_at_100, "masked": true });
        out["ndcg_difference"] = json!(ndcg - s.ndcg_at_10);
    }
    println!("{out}");
    Ok(())
}

/// Ranked document ids per query, `concurrency` Search calls at a time, no reranking.
pub async fn search_all(
    client: &RagClient<Channel>,
    queries: &[(String, String)],
    k: u32,
    concurrency: usize,
) -> Result<BTreeMap<String, Vec<String>>> {
    use futures::StreamExt;
    let results: Vec<Result<(String, Vec<String>)>> = futures::stream::iter(queries.iter().cloned())
        .map(|(qid, text)| {
            let mut c = client.clone();
            async move {
                let r = c
                    .search(SearchRequest { query: text, top_k: k, rerank: Some(false) })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                Ok((qid, r.passages.into_iter().map(|p| p.document_id).collect()))
            }
        })
        .buffered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

// ---------------------------------------------------------------------------------------
// bench

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// BEIR folder for documents and questions (default: generated text).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Documents to ingest (0: skip the ingest benchmark).
    #[arg(long, default_value_t = 500)]
    pub docs: usize,
    /// Queries per concurrency level (at least twice the level).
    #[arg(long, default_value_t = 16)]
    pub queries: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub concurrency: Vec<usize>,
    /// Answer tokens per query.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 4)]
    pub top_k: u32,
    #[arg(long, action = clap::ArgAction::Set)]
    pub rerank: Option<bool>,
    /// Also write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Generated paragraphs with enough vocabulary for retrieval to mean something.
fn synthetic_docs(n: usize) -> Vec<(String, String, String)> {
    const TOPICS: [&str; 8] = [
        "vitamin D",
        "protein folding",
        "insulin signalling",
        "gut bacteria",
        "T cells",
        "DNA repair",
        "sleep",
        "malaria",
    ];
    const VERBS: [&str; 6] = ["regulates", "reduces", "increases", "is associated with", "does not affect", "predicts"];
    const OBJECTS: [&str; 6] =
        ["bone density", "inflammation", "mortality", "cell growth", "memory", "drug resistance"];
    (0..n)
        .map(|i| {
            let topic = TOPICS[i % TOPICS.len()];
            let mut text = String::new();
            for s in 0..12 {
                let v = VERBS[(i + s) % VERBS.len()];
                let o = OBJECTS[(i * 7 + s) % OBJECTS.len()];
                text.push_str(&format!(
                    "In cohort {i}-{s}, {topic} {v} {o} in {} of {} patients. ",
                    10 + (i * s) % 90,
                    100 + s
                ));
            }
            (format!("bench-{i}"), format!("Study {i} on {topic}"), text)
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[derive(Default)]
struct Sample {
    total: f64,
    first_token: f64,
    stages: [f64; 4],
}

async fn one_query(mut c: RagClient<Channel>, question: String, a: &BenchArgs) -> Result<Sample, tonic::Status> {
    let t = Instant::now();
    let req = QueryRequest {
        question,
        top_k: a.top_k,
        max_tokens: a.max_tokens,
        temperature: 0.0,
        seed: 0,
        rerank: a.rerank,
    };
    let mut s = c.query(req).await?.into_inner();
    let mut out = Sample::default();
    while let Some(m) = s.message().await? {
        if let Some(Event::Timings(tm)) = m.event {
            out.first_token = tm.first_token_seconds;
            out.stages = [tm.embed_seconds, tm.search_seconds, tm.rerank_seconds, tm.generate_seconds];
        }
    }
    out.total = t.elapsed().as_secs_f64();
    Ok(out)
}

pub(super) async fn bench(a: BenchArgs) -> Result<()> {
    let client = a.conn.connect().await?;
    let (docs, questions): (Vec<(String, String, String)>, Vec<String>) = match &a.data {
        Some(dir) => {
            let data = models::beir::BeirData::load(dir)?;
            let docs = beir_corpus(dir, Some(a.docs), &HashSet::new())?;
            (docs, data.queries.into_iter().map(|(_, q)| q).collect())
        }
        None => (
            synthetic_docs(a.docs),
            [
                "Does vitamin D affect bone density?",
                "What reduces inflammation?",
                "Is sleep associated with memory?",
                "What predicts mortality in malaria?",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ),
    };
    let mut report = json!({});
    if a.docs > 0 {
        report["ingest"] = bench_ingest(&client, &docs, &a.concurrency).await?;
    }
    report["query"] = bench_queries(&client, &questions, &a).await?;
    report["max_tokens"] = json!(a.max_tokens);
    report["top_k"] = json!(a.top_k);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Ingest at each concurrency level: the documents split over `c` client streams at once,
/// under ids of their own per level (so no level replaces another's).
async fn bench_ingest(
    client: &RagClient<Channel>,
    docs: &[(String, String, String)],
    concurrency: &[usize],
) -> Result<Value> {
    let bytes: usize = docs.iter().map(|(_, t, x)| t.len() + x.len()).sum();
    let mut ingests = Vec::new();
    for &c in concurrency {
        let c = c.max(1);
        let t = Instant::now();
        let mut tasks = Vec::new();
        for k in 0..c {
            let part: Vec<_> = docs
                .iter()
                .skip(k)
                .step_by(c)
                .map(|(id, ti, x)| (format!("{id}@c{c}"), ti.clone(), x.clone()))
                .collect();
            let mut cl = client.clone();
            tasks.push(tokio::spawn(async move {
                let (tx, rx) = tokio::sync::mpsc::channel(64);
                tokio::spawn(async move {
                    for (id, title, text) in part {
                        if tx.send(doc(id, title, text, BTreeMap::new(), false)).await.is_err() {
                            break;
                        }
                    }
                });
                cl.ingest(tokio_stream::wrappers::ReceiverStream::new(rx)).await.map(|r| r.into_inner())
            }));
        }
        let (mut documents, mut chunks) = (0u64, 0u64);
        for task in tasks {
            let s = task.await?.map_err(status_error)?;
            documents += u64::from(s.documents);
            chunks += u64::from(s.chunks);
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "ingest c={c:>2}: {documents} documents ({:.1} MB, {chunks} passages) in {secs:.1} s = {:.1} docs/s, {:.1} passages/s",
            bytes as f64 / 1e6,
            documents as f64 / secs,
            chunks as f64 / secs
        );
        ingests.push(
            json!({ "concurrency": c, "documents": documents, "passages": chunks, "bytes": bytes, "seconds": secs,
            "docs_per_second": documents as f64 / secs, "passages_per_second": chunks as f64 / secs }),
        );
    }
    Ok(Value::Array(ingests))
}

/// Queries at each concurrency level: latency, time to first token and each stage's share.
async fn bench_queries(client: &RagClient<Channel>, questions: &[String], a: &BenchArgs) -> Result<Value> {
    use futures::StreamExt;
    let mut levels = Vec::new();
    for &c in &a.concurrency {
        let c = c.max(1);
        let n = a.queries.max(2 * c);
        let qs: Vec<String> = (0..n).map(|i| questions[i % questions.len()].clone()).collect();
        let t = Instant::now();
        let results: Vec<Result<Sample, tonic::Status>> =
            futures::stream::iter(qs).map(|q| one_query(client.clone(), q, a)).buffer_unordered(c).collect().await;
        let wall = t.elapsed().as_secs_f64();
        // A query the pipeline refused (an overloaded stage sheds load with
        // RESOURCE_EXHAUSTED) is counted by its code; the latencies are those of the answered.
        let mut failed: BTreeMap<String, usize> = BTreeMap::new();
        let mut samples = Vec::new();
        for r in results {
            match r {
                Ok(s) => samples.push(s),
                Err(s) => *failed.entry(format!("{:?}", s.code())).or_default() += 1,
            }
        }
        if samples.is_empty() {
            bail!("query c={c}: all {n} queries failed: {failed:?}");
        }
        let failures = failed.iter().map(|(code, k)| format!("{k} {code}")).collect::<Vec<_>>().join(", ");
        let mut totals: Vec<f64> = samples.iter().map(|s| s.total).collect();
        totals.sort_by(f64::total_cmp);
        let mut ttft: Vec<f64> = samples.iter().map(|s| s.first_token).collect();
        ttft.sort_by(f64::total_cmp);
        let sum_total: f64 = samples.iter().map(|s| s.total).sum();
        let stage_sum: Vec<f64> = (0..4).map(|i| samples.iter().map(|s| s.stages[i]).sum::<f64>()).collect();
        let share: Vec<f64> = stage_sum.iter().map(|s| 100.0 * s / sum_total.max(1e-9)).collect();
        let other = 100.0 - share.iter().sum::<f64>();
        println!(
            "query c={c:>2}: {n} queries in {wall:.1} s ({:.2} answered/s{}) latency p50 {:.2} s p95 {:.2} s, first token p50 {:.2} s p95 {:.2} s; \
             time share embed {:.1}% search {:.1}% rerank {:.1}% generate {:.1}% other {:.1}%",
            samples.len() as f64 / wall,
            if failures.is_empty() { String::new() } else { format!("; failed: {failures}") },
            percentile(&totals, 0.5),
            percentile(&totals, 0.95),
            percentile(&ttft, 0.5),
            percentile(&ttft, 0.95),
            share[0],
            share[1],
            share[2],
            share[3],
            other
        );
        levels.push(json!({
            "concurrency": c, "queries": n, "answered": samples.len(), "failed": failed, "wall_seconds": wall, "p50_seconds": percentile(&totals, 0.5), "p95_seconds": percentile(&totals, 0.95),
            "first_token_p50_seconds": percentile(&ttft, 0.5), "first_token_p95_seconds": percentile(&ttft, 0.95),
            "share_percent": { "embed": share[0], "search": share[1], "rerank": share[2], "generate": share[3], "other": other },
        }));
    }
    Ok(Value::Array(levels))
}
