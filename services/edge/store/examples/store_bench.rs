//! Document store benchmark: ingest rate, open (reload) time and query latency of
//! `EncryptedRedbStore` at a given number of chunks.
//!
//! ```sh
//! cargo run --release -p gelo-store --example store_bench -- --chunks 100000,1000000
//! ```
//!
//! Options: `--chunks N[,N...]` (default 100000), `--dim D` (384), `--chunks-per-doc C` (10),
//! `--docs-per-commit B` (100), `--text-bytes T` (600), `--queries Q` (50), `--top-k K` (10),
//! `--dir PATH` (a temporary folder under the system temp dir; removed afterwards),
//! `--clusters C` (0), `--spread S` (1.0), `--ann-threshold N` (none), `--nprobe P` (64).
//!
//! Vectors are random unit vectors, texts random words: the store's cost does not depend on
//! what they mean. Each size runs in a fresh store. With `--clusters C` the vectors (and
//! queries) are drawn around C random unit centres instead, each `normalize(centre + S × u)`
//! for a random unit `u` (S = 1: cosine about 0.7 to the centre), which gives an IVF index
//! the structure real embeddings have and uniform random vectors lack.
//!
//! With `--ann-threshold N` below the chunk count, the queries run twice: on the store opened
//! for exact search, then reopened with `StoreOptions { ann_threshold: N, nprobe: P }` (the
//! reopen then includes building the IVF index), and recall@k of the second run is measured
//! against the first.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use store::{Chunk, Document, EncryptedRedbStore, SealingKey, StoreOptions, VectorStore};

struct Options {
    chunks: Vec<usize>,
    dim: usize,
    chunks_per_doc: usize,
    docs_per_commit: usize,
    text_bytes: usize,
    queries: usize,
    top_k: usize,
    dir: Option<PathBuf>,
    clusters: usize,
    spread: f32,
    ann_threshold: Option<usize>,
    nprobe: usize,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        chunks: vec![100_000],
        dim: 384,
        chunks_per_doc: 10,
        docs_per_commit: 100,
        text_bytes: 600,
        queries: 50,
        top_k: 10,
        dir: None,
        clusters: 0,
        spread: 1.0,
        ann_threshold: None,
        nprobe: StoreOptions::default().nprobe,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--chunks" => o.chunks = value.split(',').map(num).collect::<Result<_, _>>()?,
            "--dim" => o.dim = num(&value)?,
            "--chunks-per-doc" => o.chunks_per_doc = num(&value)?,
            "--docs-per-commit" => o.docs_per_commit = num(&value)?,
            "--text-bytes" => o.text_bytes = num(&value)?,
            "--queries" => o.queries = num(&value)?,
            "--top-k" => o.top_k = num(&value)?,
            "--dir" => o.dir = Some(PathBuf::from(value)),
            "--clusters" => o.clusters = num(&value)?,
            "--spread" => o.spread = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?,
            "--ann-threshold" => o.ann_threshold = Some(num(&value)?),
            "--nprobe" => o.nprobe = num(&value)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

fn unit(rng: &mut ChaCha8Rng, dim: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

/// Where vectors come from: uniform on the sphere, or around fixed centres.
struct Vectors {
    dim: usize,
    centres: Vec<Vec<f32>>,
    spread: f32,
}

impl Vectors {
    fn next(&self, rng: &mut ChaCha8Rng) -> Vec<f32> {
        if self.centres.is_empty() {
            return unit(rng, self.dim);
        }
        let c = &self.centres[rng.random_range(0..self.centres.len())];
        let v: Vec<f32> = c.iter().zip(unit(rng, self.dim)).map(|(a, b)| a + self.spread * b).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }
}

/// Runs the queries (after 3 warm-up queries): sorted latencies and each query's hit ids.
fn queries(
    store: &EncryptedRedbStore,
    queries: &[Vec<f32>],
    k: usize,
    expect: usize,
) -> Result<(Vec<Duration>, Vec<Vec<String>>), store::StoreError> {
    for q in &queries[..3] {
        store.search(q, k)?;
    }
    let mut lat = Vec::new();
    let mut ids = Vec::new();
    for q in &queries[3..] {
        let t = Instant::now();
        let hits = store.search(q, k)?;
        lat.push(t.elapsed());
        assert_eq!(hits.len(), expect);
        ids.push(hits.into_iter().map(|h| h.passage_id).collect());
    }
    lat.sort();
    Ok((lat, ids))
}

fn latency_line(what: &str, k: usize, lat: &[Duration]) -> String {
    let mean = lat.iter().sum::<Duration>() / lat.len() as u32;
    format!(
        "  {what} top-{k}: p50 {:.2} ms  p95 {:.2} ms  mean {:.2} ms  max {:.2} ms  ({} queries)",
        ms(percentile(lat, 0.5)),
        ms(percentile(lat, 0.95)),
        ms(mean),
        ms(*lat.last().unwrap()),
        lat.len()
    )
}

fn text(rng: &mut ChaCha8Rng, bytes: usize) -> String {
    const WORDS: [&str; 12] =
        ["the", "cell", "protein", "binding", "of", "results", "in", "patients", "with", "increased", "risk", "study"];
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        s.push(' ');
    }
    s
}

fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

const MIB: f64 = (1 << 20) as f64;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run(o: &Options, total_chunks: usize) -> Result<(), Box<dyn std::error::Error>> {
    let base = o.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new().prefix("gelo-store-bench").tempdir_in(base)?;
    let path = dir.path().join("bench.redb");
    let key = SealingKey::generate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(total_chunks as u64);
    let docs = total_chunks.div_ceil(o.chunks_per_doc);
    let vectors =
        Vectors { dim: o.dim, centres: (0..o.clusters).map(|_| unit(&mut rng, o.dim)).collect(), spread: o.spread };
    let exact = StoreOptions { ann_threshold: usize::MAX, ..StoreOptions::default() };

    // 1. Ingest, one commit per batch of documents. Generating the inputs is timed apart.
    let store = EncryptedRedbStore::open_with(&path, &key, o.dim, exact)?;
    let (mut ingest, mut generate) = (Duration::ZERO, Duration::ZERO);
    let mut written = 0;
    let mut d = 0;
    while d < docs {
        let t = Instant::now();
        let batch: Vec<Document> = (d..(d + o.docs_per_commit).min(docs))
            .map(|i| {
                let n = o.chunks_per_doc.min(total_chunks - i * o.chunks_per_doc);
                Document {
                    id: format!("doc-{i}"),
                    title: format!("Document {i}"),
                    metadata: [("source".to_string(), format!("bench/{i}.txt"))].into(),
                    chunks: (0..n)
                        .map(|_| Chunk { text: text(&mut rng, o.text_bytes), embedding: vectors.next(&mut rng) })
                        .collect(),
                }
            })
            .collect();
        generate += t.elapsed();
        let t = Instant::now();
        store.upsert(&batch)?;
        ingest += t.elapsed();
        written += batch.iter().map(|b| b.chunks.len()).sum::<usize>();
        d += o.docs_per_commit;
    }
    let stats = store.stats()?;
    assert_eq!(stats.chunks as usize, written);
    let length = std::fs::metadata(&path)?.len();
    let rss_after_ingest = rss_mib();
    drop(store);

    // 2. Reopen: integrity check, decrypt every vector, rebuild the index. The integrity check
    //    alone is timed first with redb by itself (the file is in the page cache both times).
    let t = Instant::now();
    redb::Database::builder().set_check_integrity_on_open(true).create(&path)?;
    let integrity = t.elapsed();
    let t = Instant::now();
    let store = EncryptedRedbStore::open_with(&path, &key, o.dim, exact)?;
    let open = t.elapsed();
    assert_eq!(store.stats()?.chunks as usize, written);

    // 3. Queries, exact; then, with an ANN threshold, through the IVF index.
    let qs: Vec<Vec<f32>> = (0..o.queries + 3).map(|_| vectors.next(&mut rng)).collect();
    let expect = o.top_k.min(written);
    let (lat, exact_ids) = queries(&store, &qs, o.top_k, expect)?;
    let ann = match o.ann_threshold {
        Some(threshold) if threshold < written => {
            drop(store);
            let t = Instant::now();
            let options = StoreOptions { ann_threshold: threshold, nprobe: o.nprobe };
            let store = EncryptedRedbStore::open_with(&path, &key, o.dim, options)?;
            let open = t.elapsed();
            let (lat, ids) = queries(&store, &qs, o.top_k, expect)?;
            let found: usize =
                ids.iter().zip(&exact_ids).map(|(got, want)| got.iter().filter(|g| want.contains(g)).count()).sum();
            Some((open, lat, found as f64 / (exact_ids.len() * expect) as f64))
        }
        _ => None,
    };

    let data = match o.clusters {
        0 => "uniform random".to_string(),
        c => format!("{c} clusters, spread {}", o.spread),
    };
    println!(
        "chunks {written} (docs {docs}, dim {}, {data}, text {} B, {} docs/commit, threads {})",
        o.dim,
        o.text_bytes,
        o.docs_per_commit,
        rayon::current_num_threads()
    );
    println!(
        "  ingest   {:.1} s  {:.0} chunks/s  {:.0} docs/s   (input generation {:.1} s, not counted)",
        ingest.as_secs_f64(),
        written as f64 / ingest.as_secs_f64(),
        docs as f64 / ingest.as_secs_f64(),
        generate.as_secs_f64()
    );
    println!(
        "  file     {:.0} MiB long, {:.0} MiB allocated ({:.0} B/chunk allocated)",
        length as f64 / MIB,
        stats.bytes_on_disk as f64 / MIB,
        stats.bytes_on_disk as f64 / written as f64
    );
    println!(
        "  reopen   {:.2} s (integrity check {:.2} s, then decrypt all vectors, rebuild index)",
        open.as_secs_f64(),
        integrity.as_secs_f64()
    );
    println!("{}", latency_line("query    exact", o.top_k, &lat));
    if let Some((open, lat, recall)) = ann {
        println!(
            "  IVF      reopen with index build {:.2} s; nprobe {} of ~{:.0} lists; recall@{} vs exact {recall:.3}",
            open.as_secs_f64(),
            o.nprobe,
            (written as f64).sqrt(),
            o.top_k
        );
        println!("{}", latency_line("query    IVF  ", o.top_k, &lat));
    }
    if let (Some(a), Some(b)) = (rss_after_ingest, rss_mib()) {
        println!("  RSS      {a:.0} MiB after ingest, {b:.0} MiB after reopen and queries");
    }
    Ok(())
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("store_bench: {e}");
            std::process::exit(2);
        }
    };
    for &n in &o.chunks {
        if let Err(e) = run(&o, n) {
            eprintln!("store_bench: {e}");
            std::process::exit(1);
        }
    }
}
