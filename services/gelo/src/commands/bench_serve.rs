//! `gelo bench serve`: a model service started as its own process (RA-TLS, mock
//! attestation, masked), driven by concurrent gRPC clients, against the same model's
//! in-process rate on the same machine.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use api::v1::{embedder_client::EmbedderClient, generator_client::GeneratorClient, EmbedRequest, GenerateRequest};
use attest::{issuer::default_mock_measurement, ExpectedPeer, MockPki, Policy, TrustedRoot};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// embedder or generator.
    #[arg(long, default_value = "embedder")]
    role: String,
    #[arg(long)]
    model: PathBuf,
    /// Concurrent clients (embedder) or streams (generator).
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    concurrency: Vec<usize>,
    /// Requests per client (embedder: one text each).
    #[arg(long, default_value_t = 4)]
    requests: usize,
    /// Alternating served / in-process rounds per level (embedder; medians reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Tokens per generated answer (generator).
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
}

fn text(i: usize) -> String {
    format!("Passage {i}: confidential retrieval needs an embedding of every chunk, computed where the data is safe, at {i} tokens per second.")
}

pub fn run(a: ServeArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(run_async(a))
}

async fn run_async(a: ServeArgs) -> Result<()> {
    let pki_dir = std::env::temp_dir().join(format!("gelo-bench-pki-{}", std::process::id()));
    let pki = MockPki::load_or_create(&pki_dir)?;
    let policy = Arc::new(Policy::default().with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())]).allow_measurement(default_mock_measurement()));
    let mut child = Command::new(std::env::current_exe()?)
        .args([a.role.as_str(), "--model", a.model.to_str().context("model path")?, "--max-queue", "100000", "--max-texts", "256"])
        .env("GELO_ATTEST_ISSUER", "mock")
        .env("GELO_MOCK_PKI_DIR", &pki_dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("grpc=")).context("no ready line")?.to_string();
    let ch = attest::ratls::connect(&addr, policy, ExpectedPeer::default(), None).await?;
    let result = match a.role.as_str() {
        "embedder" => embedder(&a, ch.channel()).await,
        "generator" => generator(&a, ch.channel()).await,
        other => Err(anyhow::anyhow!("unknown role {other}")),
    };
    let _ = child.kill();
    let _ = std::fs::remove_dir_all(&pki_dir);
    result
}

async fn embedder(a: &ServeArgs, channel: tonic::transport::Channel) -> Result<()> {
    // In-process reference: the same model on its own masked CPU executor, embedding the
    // same texts in batches of what `c` clients can at best have in flight together (one
    // text each): batch 1 for one client, batch c for c clients.
    let exec: Arc<dyn protocol::Executor> = Arc::new(protocol::MaskedExecutor::new(Arc::new(kernels::CpuEngine::new()), Default::default())?);
    let e = models::load_embedder(&a.model, exec, &Default::default())?;
    // `texts` texts in batches of `b`; texts/s.
    let in_process = |b: usize, texts: usize| -> Result<f64> {
        let batch: Vec<String> = (0..b).map(|i| text(500_000 + i)).collect();
        let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
        let (t, mut done) = (Instant::now(), 0usize);
        while done < texts {
            e.embed(&refs)?;
            done += b;
        }
        Ok(done as f64 / t.elapsed().as_secs_f64())
    };
    println!("| clients | texts/s served | in-process texts/s (batch = clients) | served / in-process | rounds |");
    println!("|---|---|---|---|---|");
    let client = EmbedderClient::new(channel);
    client.clone().embed(EmbedRequest { texts: vec![text(0)], ..Default::default() }).await?;
    in_process(1, 1)?;
    for &c in &a.concurrency {
        // Served and in-process phases alternate, so the machine's drift hits both; the
        // table has the medians.
        let (mut served, mut reference) = (Vec::new(), Vec::new());
        for round in 0..a.rounds {
            let t = Instant::now();
            let mut tasks = Vec::new();
            for k in 0..c {
                let mut cl = client.clone();
                let n = a.requests;
                tasks.push(tokio::spawn(async move {
                    for r in 0..n {
                        cl.embed(EmbedRequest { texts: vec![text(round * 1_000_000 + k * 1000 + r)], ..Default::default() }).await?;
                    }
                    Ok::<_, tonic::Status>(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            served.push((c * a.requests) as f64 / t.elapsed().as_secs_f64());
            reference.push(in_process(c, c * a.requests)?);
        }
        let (rate, reference) = (median(served), median(reference));
        println!("| {c} | {rate:.1} | {reference:.1} | {:.2} | {} |", rate / reference, a.rounds);
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn generator(a: &ServeArgs, channel: tonic::transport::Channel) -> Result<()> {
    println!("| streams | aggregate tok/s | mean TTFT s | max TTFT s |");
    println!("|---|---|---|---|");
    let client = GeneratorClient::new(channel);
    for &c in &a.concurrency {
        let t = Instant::now();
        let mut tasks = Vec::new();
        for k in 0..c {
            let mut cl = client.clone();
            let req = GenerateRequest { raw_prompt: format!("{k}, {}, {},", k + 1, k + 2), max_tokens: a.max_tokens, ..Default::default() };
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                let mut s = cl.generate(req).await?.into_inner();
                let (mut first, mut tokens) = (None, 0usize);
                while let Some(m) = s.message().await? {
                    first.get_or_insert(t.elapsed());
                    tokens += m.token_ids.len();
                }
                Ok::<_, tonic::Status>((first.unwrap_or_default(), tokens))
            }));
        }
        let (mut total, mut ttfts) = (0, Vec::new());
        for t in tasks {
            let (f, n) = t.await??;
            ttfts.push(f);
            total += n;
        }
        if total == 0 {
            bail!("no tokens generated");
        }
        let mean = ttfts.iter().sum::<Duration>().as_secs_f64() / ttfts.len() as f64;
        let max = ttfts.iter().max().copied().unwrap_or_default().as_secs_f64();
        println!("| {c} | {:.1} | {mean:.2} | {max:.2} |", total as f64 / t.elapsed().as_secs_f64());
    }
    Ok(())
}
