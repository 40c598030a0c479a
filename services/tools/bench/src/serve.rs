//! `gelo bench serve`: a model service started as its own process (RA-TLS, mock
//! attestation, the protection `--protection` names), driven by concurrent gRPC clients,
//! against the same model's in-process rate under the same protection on the same machine.
//! With `--role gateway`, a soak of a running gateway's HTTP port instead ([`soak`]).

mod soak;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use api::v1::{EmbedRequest, GenerateRequest, embedder_client::EmbedderClient, generator_client::GeneratorClient};
use attest::{ExpectedPeer, MockPki, Policy, TrustedRoot, issuer::default_mock_measurement};

use crate::linears::median;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// embedder or generator (a model service started here), or gateway (a running one soaked).
    #[arg(long, default_value = "embedder")]
    role: String,
    /// The model (embedder, generator); not used with `--role gateway`.
    #[arg(long)]
    model: Option<PathBuf>,
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
    /// The service's protection (and the in-process reference's): sealed or masked.
    #[arg(long, default_value = "sealed")]
    protection: protocol::Protection,
    /// `--role gateway`: the gateway's HTTP address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: std::net::SocketAddr,
    /// `--role gateway`: the HTTP API key (default: $OPENAI_API_KEY, as `gelo up` prints it).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true, default_value = "")]
    api_key: String,
    /// `--role gateway`: seconds of soak after the warm-up.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// `--role gateway`: seconds of load before the measured soak (memory baseline after it).
    #[arg(long, default_value_t = 20.0)]
    warmup: f64,
    /// `--role gateway`: streamed answers sent at once after the soak, to check that those
    /// beyond the gateway's --max-concurrent-requests are refused at once (0: skip).
    #[arg(long, default_value_t = 0)]
    overload: usize,
    /// `--role gateway`: `role=pid,...` of the processes whose memory is reported (default:
    /// every `gelo` process serving a role).
    #[arg(long, value_delimiter = ',')]
    pids: Vec<String>,
    /// `--role gateway`: also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn soak_args(a: &ServeArgs) -> Result<soak::SoakArgs> {
    if a.api_key.is_empty() {
        bail!("--role gateway needs the HTTP API key: --api-key or OPENAI_API_KEY");
    }
    let pids = a
        .pids
        .iter()
        .map(|p| {
            let (role, pid) = p.split_once('=').context("--pids takes role=PID")?;
            Ok((role.to_string(), pid.parse().context("--pids: a process id")?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(soak::SoakArgs {
        http: a.http,
        api_key: a.api_key.clone(),
        concurrency: a.concurrency.first().copied().unwrap_or(1).max(1),
        duration: Duration::from_secs_f64(a.duration),
        warmup: Duration::from_secs_f64(a.warmup),
        max_tokens: a.max_tokens,
        overload: a.overload,
        pids,
        json_out: a.json.clone(),
    })
}

fn text(i: usize) -> String {
    format!(
        "Passage {i}: confidential retrieval needs an embedding of every chunk, computed where the data is safe, at {i} tokens per second."
    )
}

pub fn run(a: ServeArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(run_async(a))
}

async fn run_async(a: ServeArgs) -> Result<()> {
    if a.role == "gateway" {
        return soak::run(soak_args(&a)?).await;
    }
    let model = a.model.clone().context("--model is required for --role embedder and generator")?;
    let pki_dir = std::env::temp_dir().join(format!("gelo-bench-pki-{}", std::process::id()));
    let pki = MockPki::load_or_create(&pki_dir)?;
    let policy = Arc::new(
        Policy::default()
            .with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())])
            .allow_measurement(default_mock_measurement())
            .allow_protection(a.protection.as_str()),
    );
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            a.role.as_str(),
            "--model",
            model.to_str().context("model path")?,
            "--max-queue",
            "100000",
            "--max-texts",
            "256",
        ])
        .args(["--metrics-listen", "127.0.0.1:0", "--protection", a.protection.as_str()])
        .env("GELO_ATTEST_ISSUER", "mock")
        .env("GELO_MOCK_PKI_DIR", &pki_dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).map(str::to_string);
    let addr = field("grpc=").context("no ready line")?;
    let metrics = field("metrics=").context("no metrics address on the ready line")?;
    let ch = attest::ratls::connect(&addr, policy, ExpectedPeer::default(), None).await?;
    let result = match a.role.as_str() {
        "embedder" => embedder(&a, &model, ch.channel(), &metrics).await,
        "generator" => generator(&a, ch.channel()).await,
        other => Err(anyhow::anyhow!("unknown role {other}")),
    };
    let _ = child.kill();
    let _ = std::fs::remove_dir_all(&pki_dir);
    result
}

/// The server's time so far, from its Prometheus endpoint: in forward passes (engine + TEE
/// seconds) and in Embed calls (from request to response, summed over requests).
fn server_seconds(metrics: &str) -> Result<(f64, f64)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(metrics)?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {metrics}\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let sum = |what: &[&str]| -> f64 {
        body.lines()
            .filter(|l| !l.starts_with('#') && what.iter().any(|w| l.contains(w)))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum()
    };
    Ok((sum(&["engine_seconds", "tee_seconds"]), sum(&["request_seconds_sum"])))
}

async fn embedder(
    a: &ServeArgs,
    model: &std::path::Path,
    channel: tonic::transport::Channel,
    metrics: &str,
) -> Result<()> {
    // In-process reference: the same model under the same protection (CPU engine), embedding the
    // same texts in batches of what `c` clients can at best have in flight together (one
    // text each): batch 1 for one client, batch c for c clients. Each pass runs on the
    // rayon pool, as the server's do (`models::on_pool`).
    let exec = a.protection.executor(Arc::new(kernels::CpuEngine::new()), Default::default())?;
    let e = models::load_embedder(model, exec, &Default::default())?;
    // The texts the `c` clients of round `round` send, in batches of `c` (request r of
    // every client together): served and in-process embed exactly the same token counts.
    let in_process = |round: usize, c: usize, requests: usize| -> Result<f64> {
        let t = Instant::now();
        for r in 0..requests {
            let batch: Vec<String> = (0..c).map(|k| text(round * 1_000_000 + k * 1000 + r)).collect();
            let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
            models::on_pool(|| e.embed(&refs))?;
        }
        Ok((c * requests) as f64 / t.elapsed().as_secs_f64())
    };
    // The last two columns split the gap: the server's own forward-pass time per text
    // against the in-process time per text (≈ 1: the passes ran as fast as in-process, the
    // gap is RPC, queueing and the clients' CPU; > 1: the passes themselves were slowed), and
    // (one client) the server's time per request outside its pass (decoding, tokenizing,
    // queueing, replying).
    println!(
        "| clients | texts/s served | in-process texts/s (batch = clients) | served / in-process | rounds | server model s/text ÷ in-process s/text | server ms/request outside the model |"
    );
    println!("|---|---|---|---|---|---|---|");
    let client = EmbedderClient::new(channel);
    client.clone().embed(EmbedRequest { texts: vec![text(0)], ..Default::default() }).await?;
    in_process(0, 1, 1)?;
    for &c in &a.concurrency {
        // Served and in-process phases alternate, so the machine's drift hits both; the
        // table has the medians.
        let (mut served, mut reference, mut model, mut outside) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..a.rounds {
            let before = server_seconds(metrics)?;
            let t = Instant::now();
            let mut tasks = Vec::new();
            for k in 0..c {
                let mut cl = client.clone();
                let n = a.requests;
                tasks.push(tokio::spawn(async move {
                    for r in 0..n {
                        cl.embed(EmbedRequest {
                            texts: vec![text(round * 1_000_000 + k * 1000 + r)],
                            ..Default::default()
                        })
                        .await?;
                    }
                    Ok::<_, tonic::Status>(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            served.push((c * a.requests) as f64 / t.elapsed().as_secs_f64());
            let after = server_seconds(metrics)?;
            let n = (c * a.requests) as f64;
            let r = in_process(round, c, a.requests)?;
            reference.push(r);
            model.push((after.0 - before.0) / n * r);
            outside.push(((after.1 - before.1) - (after.0 - before.0)).max(0.0) / n * 1e3);
        }
        let (rate, reference, model, outside) = (median(served), median(reference), median(model), median(outside));
        // One client: a request's latency is its pass plus everything around it. More
        // clients wait for each other's passes, so the split says nothing there.
        let outside = if c == 1 { format!("{outside:.2}") } else { "—".into() };
        println!(
            "| {c} | {rate:.1} | {reference:.1} | {:.2} | {} | {model:.2} | {outside} |",
            rate / reference,
            a.rounds
        );
    }
    Ok(())
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
            let req = GenerateRequest {
                raw_prompt: format!("{k}, {}, {},", k + 1, k + 2),
                max_tokens: a.max_tokens,
                ..Default::default()
            };
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
