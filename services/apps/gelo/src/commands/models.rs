//! Model commands: `gelo embed`, `gelo generate`, `gelo eval beir`, `gelo model …`.

use std::{io::Write, path::PathBuf, time::Instant};

use anyhow::{Context, Result};
use models::{
    ChatMessage, GenerateRequest, LoadOptions, Manifest, ModelIdentity, Prompt, SamplingParams, beir, load_embedder,
    load_generator,
};

use super::engine::ExecArgs;

#[derive(clap::Args)]
pub struct EmbedArgs {
    /// Model folder (safetensors) or GGUF file.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    exec: ExecArgs,
    /// Override the model's maximum input length.
    #[arg(long)]
    max_seq_length: Option<usize>,
    /// Texts to embed; one JSON array is printed per text.
    #[arg(required = true)]
    texts: Vec<String>,
}

pub fn embed(a: EmbedArgs) -> Result<()> {
    let opts = LoadOptions { max_seq_length: a.max_seq_length, ..Default::default() };
    let e = load_embedder(&a.model, a.exec.executor()?, &opts)?;
    let texts: Vec<&str> = a.texts.iter().map(String::as_str).collect();
    let mut out = std::io::stdout().lock();
    for v in e.embed(&texts)? {
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct GenerateArgs {
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    exec: ExecArgs,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Complete the prompt as plain text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print token ids and timing to stderr.
    #[arg(long)]
    verbose: bool,
}

pub fn generate(a: GenerateArgs) -> Result<()> {
    let g = load_generator(&a.model, a.exec.executor()?, &LoadOptions::default())?;
    let prompt =
        if a.raw { Prompt::Raw(a.prompt.clone()) } else { Prompt::Chat(vec![ChatMessage::new("user", &a.prompt)]) };
    let req = GenerateRequest {
        prompt,
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
            ..Default::default()
        },
        stop: Vec::new(),
        stop_repeated_words: 0,
    };
    let t = Instant::now();
    let mut first = None;
    let mut out = std::io::stdout().lock();
    let done = g.generate(&req, |c| {
        first.get_or_insert_with(|| t.elapsed());
        let _ = out.write_all(c.text.as_bytes());
        let _ = out.flush();
        true
    })?;
    writeln!(out)?;
    if a.verbose {
        let total = t.elapsed().as_secs_f64();
        let ttft = first.unwrap_or_default().as_secs_f64();
        eprintln!("tokens {:?}", done.tokens);
        eprintln!(
            "prompt {} tokens, generated {} ({:?}), ttft {:.3}s, decode {:.2} tok/s",
            done.prompt_tokens,
            done.tokens.len(),
            done.finish,
            ttft,
            done.tokens.len().saturating_sub(1) as f64 / (total - ttft).max(1e-9)
        );
    }
    Ok(())
}

#[derive(clap::Subcommand)]
pub enum EvalArgs {
    /// nDCG@10 and Recall@100 of an embedder on a BEIR-format folder.
    Beir(BeirArgs),
    /// How often a reranker puts a query's relevant document above a random one.
    Rerank(RerankEvalArgs),
}

#[derive(clap::Args)]
pub struct RerankEvalArgs {
    /// Folder with corpus.jsonl, queries.jsonl and qrels/test.tsv.
    #[arg(long)]
    data: PathBuf,
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    exec: ExecArgs,
    /// Judged queries to try (in file order).
    #[arg(long, default_value_t = 50)]
    queries: usize,
    /// Longest (query, document) prompt in tokens; longer documents are cut.
    #[arg(long, default_value_t = 512)]
    max_seq_length: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Task instruction for LLM rerankers (Qwen3-Reranker's `<Instruct>`).
    #[arg(long)]
    instruction: Option<String>,
}

#[derive(clap::Args)]
pub struct BeirArgs {
    /// Folder with corpus.jsonl, queries.jsonl and qrels/test.tsv.
    #[arg(long)]
    data: PathBuf,
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    exec: ExecArgs,
    /// Texts per forward pass.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    #[arg(long)]
    max_seq_length: Option<usize>,
    /// Evaluate on the first N corpus documents only (plus every judged document).
    #[arg(long)]
    limit: Option<usize>,
}

pub fn eval(a: EvalArgs) -> Result<()> {
    let a = match a {
        EvalArgs::Beir(a) => a,
        EvalArgs::Rerank(r) => return eval_rerank(r),
    };
    let mut data = beir::BeirData::load(&a.data)?;
    if let Some(limit) = a.limit {
        let judged: std::collections::HashSet<&String> = data.qrels.values().flat_map(|m| m.keys()).collect();
        let keep: Vec<bool> =
            data.corpus.iter().enumerate().map(|(i, (id, _))| i < limit || judged.contains(id)).collect();
        let mut it = keep.iter();
        data.corpus.retain(|_| *it.next().expect("same length"));
    }
    let opts = LoadOptions { max_seq_length: a.max_seq_length, ..Default::default() };
    let protocol = a.exec.config()?;
    let e = load_embedder(&a.model, a.exec.executor_for(&protocol)?, &opts)?;
    let mut last = Instant::now();
    let s = beir::evaluate(e.as_ref(), &data, a.batch, |stage, done, total| {
        if last.elapsed().as_secs() >= 10 || done == total {
            eprintln!("{stage}: {done}/{total}");
            last = Instant::now();
        }
    })?;
    println!(
        "{}",
        serde_json::json!({
            "ndcg_at_10": s.ndcg_at_10,
            "recall_at_100": s.recall_at_100,
            "queries": s.queries,
            "documents": s.documents,
            "corpus_seconds": s.corpus_seconds,
            "query_seconds": s.query_seconds,
            "masked": a.exec.masked,
            "protection": a.exec.protocol.protection,
            "engine": protocol.engine,
        })
    );
    Ok(())
}

#[derive(clap::Subcommand)]
pub enum ModelArgs {
    /// Print a model's manifest and identity.
    Identity {
        /// Model folder or GGUF file.
        path: PathBuf,
    },
    /// Download a model from the Hugging Face hub at a pinned commit.
    Fetch {
        #[arg(long)]
        repo: String,
        /// 40-hex commit id.
        #[arg(long)]
        revision: String,
        #[arg(long)]
        out: PathBuf,
        /// Refuse (and leave nothing behind) unless the files hash to this identity.
        #[arg(long)]
        expect_identity: Option<String>,
    },
}

pub fn model(a: ModelArgs) -> Result<()> {
    match a {
        ModelArgs::Identity { path } => {
            let (_, m) = Manifest::of_path(&path)?;
            println!("{}", serde_json::json!({ "identity": m.identity().to_string(), "files": m.files }));
        }
        ModelArgs::Fetch { repo, revision, out, expect_identity } => {
            let expected = expect_identity.as_deref().map(str::parse::<ModelIdentity>).transpose()?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let m = models::hub::fetch(&repo, &revision, &out, expected.as_ref())?;
            println!("{}", serde_json::json!({ "identity": m.identity().to_string(), "files": m.files.len() }));
            if expected.is_none() {
                eprintln!("warning: no --expect-identity given; pin the identity above");
            }
        }
    }
    Ok(())
}

fn eval_rerank(a: RerankEvalArgs) -> Result<()> {
    let data = beir::BeirData::load(&a.data)?;
    let opts = LoadOptions {
        max_seq_length: Some(a.max_seq_length),
        instruction: a.instruction.clone(),
        ..Default::default()
    };
    let r = models::load_reranker(&a.model, a.exec.executor()?, &opts)?;
    let t = Instant::now();
    let (wins, tried) = beir::rerank_pairwise(r.as_ref(), &data, a.queries, a.seed)?;
    println!(
        "{}",
        serde_json::json!({
            "relevant_above_random": wins,
            "queries": tried,
            "rate": wins as f64 / tried.max(1) as f64,
            "seconds": t.elapsed().as_secs_f64(),
            "masked": a.exec.masked,
        })
    );
    Ok(())
}
