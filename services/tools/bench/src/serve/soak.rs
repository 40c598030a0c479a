//! `gelo bench serve --role gateway`: a soak of a running gateway's HTTP port (`gelo up`).
//! `--concurrency` clients send, back to back until `--duration` ends, a fixed mix: streamed
//! `gelo-rag` answers (6 in 10), embeddings (2 in 10), document ingests (1 in 10, re-adding
//! one of 16 documents, so the store stays the same size) and reranks (1 in 10). It reports
//! requests/s, p50/p95/p99 of time to first token and of whole requests per kind, errors
//! by HTTP status and code, and the resident memory of every GELO process at the start,
//! after `--warmup` and at the end.
//!
//! Then, with `--overload N`, N streamed answers at once: beyond the gateway's
//! `--max-concurrent-requests` each must be refused at once (429 `overloaded` with
//! `Retry-After`), and every admitted one must complete.
//!
//! Exits non-zero on any error other than the documented 429 `overloaded`, or on an overload
//! refusal that was slow or lacked `Retry-After`.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the soak needs beyond `ServeArgs`' concurrency and answer length.
pub struct SoakArgs {
    pub http: SocketAddr,
    pub api_key: String,
    pub concurrency: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub max_tokens: u32,
    pub overload: usize,
    /// `role=pid` of the processes whose memory is reported; empty: every `gelo` process
    /// running a role, found in /proc.
    pub pids: Vec<(String, u32)>,
    pub json_out: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Query,
    Embed,
    Ingest,
    Rerank,
}

impl Kind {
    fn of(i: u64) -> Kind {
        match i % 10 {
            0..=5 => Kind::Query,
            6 | 7 => Kind::Embed,
            8 => Kind::Ingest,
            _ => Kind::Rerank,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Query => "rag query (stream)",
            Kind::Embed => "embeddings",
            Kind::Ingest => "ingest",
            Kind::Rerank => "rerank",
        }
    }
}

/// One finished request.
struct Outcome {
    kind: Kind,
    /// `None` when it succeeded; else `"<status> <code>"`.
    error: Option<String>,
    total: Duration,
    first_token: Option<Duration>,
    retry_after: Option<String>,
}

const TOPICS: [&str; 8] = [
    "sealed inference on the CVM's own cores",
    "attestation evidence and its verifier",
    "the document store sealed with AES-GCM",
    "routing only to verified backends",
    "masked offload and its leakage",
    "the gateway's admission limit",
    "API keys stored as digests",
    "chunking by the embedder's tokens",
];

fn request(kind: Kind, i: u64, max_tokens: u32) -> (&'static str, Value) {
    let topic = TOPICS[(i as usize / 10) % TOPICS.len()];
    match kind {
        Kind::Query => (
            "/v1/chat/completions",
            json!({ "model": "gelo-rag", "stream": true, "max_tokens": max_tokens,
                    "messages": [{ "role": "user", "content": format!("What does the text say about {topic}?") }] }),
        ),
        Kind::Embed => {
            ("/v1/embeddings", json!({ "model": "gelo-embedder", "input": [topic, format!("{topic} {i}")] }))
        }
        Kind::Ingest => {
            let n = i % 16;
            let text = format!("# Note {n}\n\n{}", format!("This note is about {topic}. ").repeat(12));
            ("/v1/documents", json!({ "documents": [{ "name": format!("soak-{n}.md"), "text": text }] }))
        }
        Kind::Rerank => {
            ("/v1/rerank", json!({ "model": "gelo-reranker", "query": topic, "documents": TOPICS, "top_n": 3 }))
        }
    }
}

/// One HTTP/1.1 exchange (`Connection: close`), timing the first streamed token.
async fn call(http: SocketAddr, key: &str, kind: Kind, path: &str, body: &Value) -> Outcome {
    let t = Instant::now();
    let fail = |e: String| Outcome { kind, error: Some(e), total: t.elapsed(), first_token: None, retry_after: None };
    let Ok(mut s) = tokio::net::TcpStream::connect(http).await else { return fail("connect refused".into()) };
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {http}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).await.and(s.write_all(body.as_bytes()).await).is_err() {
        return fail("write failed".into());
    }
    let (mut raw, mut buf, mut first_token) = (Vec::new(), vec![0u8; 16 << 10], None);
    loop {
        match s.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if first_token.is_none() && kind == Kind::Query && has_token(&raw) {
                    first_token = Some(t.elapsed());
                }
            }
            Err(e) => return fail(format!("read: {}", e.kind())),
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let Some((head, rest)) = text.split_once("\r\n\r\n") else { return fail("no reply".into()) };
    let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string())
        })
    };
    let code = || {
        let at = rest.find("\"code\":\"").map(|i| i + 8);
        at.and_then(|i| rest[i..].split('"').next()).unwrap_or("-").to_string()
    };
    let error = if status != 200 {
        Some(format!("{status} {}", code()))
    } else if kind == Kind::Query && rest.contains("data: {\"error\"") {
        Some(format!("stream {}", code()))
    } else if kind == Kind::Query && !rest.contains("data: [DONE]") {
        Some("stream unfinished".into())
    } else {
        None
    };
    Outcome { kind, error, total: t.elapsed(), first_token, retry_after: header("retry-after") }
}

/// Whether the stream so far holds a text delta with content (the passages' event carries
/// an empty one).
fn has_token(raw: &[u8]) -> bool {
    let needle = b"\"delta\":{\"content\":\"";
    raw.windows(needle.len())
        .enumerate()
        .any(|(i, w)| w == needle && raw.get(i + needle.len()).is_some_and(|&c| c != b'"'))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64()
}

/// Resident memory in MiB of each process, by role.
fn memory(pids: &[(String, u32)]) -> BTreeMap<String, f64> {
    pids.iter()
        .filter_map(|(role, pid)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let kb: f64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some((format!("{role} ({pid})"), kb / 1024.0))
        })
        .collect()
}

/// Every running `gelo` process that serves a role.
fn find_pids() -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmd.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let is_gelo = args.first().is_some_and(|a| a.rsplit('/').next() == Some("gelo"));
        if is_gelo
            && let Some(role) = args.get(1)
            && ["gateway", "embedder", "reranker", "generator"].contains(&role.as_str())
        {
            out.push((role.clone(), pid));
        }
    }
    out.sort();
    out
}

/// Clients back to back until `until`; every outcome is kept.
async fn drive(a: &SoakArgs, until: Instant) -> Vec<Outcome> {
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let (outcomes, counter, key, http, max_tokens) =
            (outcomes.clone(), counter.clone(), a.api_key.clone(), a.http, a.max_tokens);
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let i = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let kind = Kind::of(i);
                let (path, body) = request(kind, i, max_tokens);
                let o = call(http, &key, kind, path, &body).await;
                outcomes.lock().expect("outcomes").push(o);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    std::mem::take(&mut *outcomes.lock().expect("outcomes"))
}

/// The table of one phase; returns the errors by code.
fn report(outcomes: &[Outcome], seconds: f64) -> BTreeMap<String, usize> {
    println!(
        "| kind | requests | requests/s | p50 s | p95 s | p99 s | TTFT p50 s | TTFT p95 s | TTFT p99 s | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut errors = BTreeMap::new();
    for kind in [Kind::Query, Kind::Embed, Kind::Ingest, Kind::Rerank] {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.kind == kind).collect();
        let mut total: Vec<Duration> = of.iter().filter(|o| o.error.is_none()).map(|o| o.total).collect();
        let mut ttft: Vec<Duration> = of.iter().filter_map(|o| o.first_token.filter(|_| o.error.is_none())).collect();
        total.sort();
        ttft.sort();
        let failed = of.iter().filter(|o| o.error.is_some()).count();
        for e in of.iter().filter_map(|o| o.error.clone()) {
            *errors.entry(e).or_default() += 1;
        }
        let ttft_cells = if kind == Kind::Query {
            format!("{:.2} | {:.2} | {:.2}", percentile(&ttft, 0.5), percentile(&ttft, 0.95), percentile(&ttft, 0.99))
        } else {
            "— | — | —".into()
        };
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {ttft_cells} | {failed} |",
            kind.name(),
            of.len(),
            of.len() as f64 / seconds,
            percentile(&total, 0.5),
            percentile(&total, 0.95),
            percentile(&total, 0.99),
        );
    }
    println!(
        "\nall: {} requests, {:.2} requests/s; errors by code: {errors:?}",
        outcomes.len(),
        outcomes.len() as f64 / seconds
    );
    errors
}

/// `N` streamed answers at once: the admitted ones complete, the others are refused at once.
async fn overload(a: &SoakArgs) -> Result<Value> {
    let tasks: Vec<_> = (0..a.overload as u64)
        .map(|i| {
            let (key, http, max_tokens) = (a.api_key.clone(), a.http, a.max_tokens);
            tokio::spawn(async move {
                let (path, body) = request(Kind::Query, i * 10, max_tokens);
                call(http, &key, Kind::Query, path, &body).await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await?);
    }
    let refused: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.as_deref() == Some("429 overloaded")).collect();
    let other: Vec<&String> =
        outcomes.iter().filter_map(|o| o.error.as_ref()).filter(|e| e.as_str() != "429 overloaded").collect();
    let slowest = refused.iter().map(|o| o.total).max().unwrap_or_default();
    let answered = outcomes.len() - refused.len() - other.len();
    println!(
        "\noverload: {} streamed answers at once: {answered} answered, {} refused with 429 overloaded (slowest refusal \
         {:.1} ms), other errors {other:?}",
        outcomes.len(),
        refused.len(),
        slowest.as_secs_f64() * 1e3
    );
    if !other.is_empty() {
        bail!("overload: errors other than 429 overloaded: {other:?}");
    }
    if refused.is_empty() {
        bail!("overload: {} at once were all admitted; set --overload above --max-concurrent-requests", a.overload);
    }
    if let Some(o) = refused.iter().find(|o| o.retry_after.is_none()) {
        bail!("overload: a 429 without Retry-After ({:?})", o.total);
    }
    if slowest > Duration::from_secs(1) {
        bail!("overload: a refusal took {slowest:?}; it must be answered at once");
    }
    Ok(
        json!({ "at_once": outcomes.len(), "answered": answered, "refused": refused.len(), "slowest_refusal_ms": slowest.as_secs_f64() * 1e3 }),
    )
}

pub async fn run(a: SoakArgs) -> Result<()> {
    let pids = if a.pids.is_empty() { find_pids() } else { a.pids.clone() };
    if pids.is_empty() {
        bail!("no gelo processes found to measure (give --pids role=PID,...)");
    }
    let start_mem = memory(&pids);
    let t0 = Instant::now();
    let warm = drive(&a, t0 + a.warmup).await;
    let warm_mem = memory(&pids);
    let t1 = Instant::now();
    let outcomes = drive(&a, t1 + a.duration).await;
    let seconds = t1.elapsed().as_secs_f64();
    let end_mem = memory(&pids);
    println!(
        "soak: {} clients, {:.0} s after a {:.0} s warm-up ({} requests in the warm-up), answers of up to {} tokens\n",
        a.concurrency,
        seconds,
        a.warmup.as_secs_f64(),
        warm.len(),
        a.max_tokens
    );
    let errors = report(&outcomes, seconds);
    println!("\n| process | RSS at start MiB | after warm-up MiB | at end MiB | growth after warm-up |");
    println!("|---|---|---|---|---|");
    let mut memory_rows = Vec::new();
    for (name, end) in &end_mem {
        let (s, w) =
            (start_mem.get(name).copied().unwrap_or(f64::NAN), warm_mem.get(name).copied().unwrap_or(f64::NAN));
        let growth = (end - w) / w * 100.0;
        println!("| {name} | {s:.1} | {w:.1} | {end:.1} | {growth:+.1} % |");
        memory_rows
            .push(json!({ "process": name, "start_mib": s, "warm_mib": w, "end_mib": end, "growth_pct": growth }));
    }
    let warm_errors: Vec<&String> = warm.iter().filter_map(|o| o.error.as_ref()).collect();
    let over = if a.overload > 0 { Some(overload(&a).await?) } else { None };
    if let Some(path) = &a.json_out {
        let out = json!({
            "concurrency": a.concurrency, "seconds": seconds, "requests": outcomes.len(),
            "errors": errors, "warmup_errors": warm_errors.len(), "memory": memory_rows, "overload": over,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&out)?).with_context(|| path.display().to_string())?;
    }
    let unexpected: Vec<&String> =
        errors.keys().chain(warm_errors.iter().copied()).filter(|e| e.as_str() != "429 overloaded").collect();
    if !unexpected.is_empty() {
        bail!("errors other than 429 overloaded: {unexpected:?}");
    }
    Ok(())
}
