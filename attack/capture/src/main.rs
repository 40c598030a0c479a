//! `gelo-attack capture`: writes what the GPU saw for a prompt corpus, per condition.

use std::{io::BufRead, path::PathBuf, time::Instant};

use anyhow::{Context, Result, bail};
use attack::{Condition, Options, Prompt};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gelo-attack", about = "GELO attack harness: capture what the untrusted GPU sees")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs prompts through a model under each condition and writes the operands.
    Capture {
        /// BERT folder (safetensors) or decoder `.gguf`.
        #[arg(long)]
        model: PathBuf,
        /// Output name of the model (folder under --out).
        #[arg(long)]
        name: String,
        /// Prompts, one JSON object per line with a `text` field.
        #[arg(long)]
        prompts: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Conditions: prod (the production default protection), c0 (plaintext), c1 (mask, no
        /// shield), c2 (the masked scheme's default), c3 (HD₃), c3b (blocked HD₃), c2s (c2 with
        /// shared decode-step masks), dual-lpn (the `dual-lpn` protection: ring operands).
        #[arg(long, default_value = "c0,c1,c2,c3", value_delimiter = ',')]
        conditions: Vec<String>,
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        /// Sequences per forward pass.
        #[arg(long, default_value_t = 4)]
        batch: usize,
        /// Teacher-forced decode steps per prompt (decoders; 0 = no decode phase).
        #[arg(long, default_value_t = 8)]
        decode_tokens: usize,
        /// Prompts that go through the decode phase.
        #[arg(long, default_value_t = 64)]
        decode_prompts: usize,
        /// Layer of the deep site (default 3/4 of the stack).
        #[arg(long)]
        deep_layer: Option<usize>,
        /// Prompts that record the wide layer-0 down-projection input.
        #[arg(long, default_value_t = 32)]
        down_prompts: usize,
    },
}

fn read_prompts(path: &PathBuf) -> Result<Vec<Prompt>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{}:{}", path.display(), i + 1))?;
        let Some(text) = v.get("text").and_then(|t| t.as_str()) else {
            bail!("{}:{}: no `text` field", path.display(), i + 1);
        };
        out.push(Prompt { id: out.len(), text: text.to_string() });
    }
    if out.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(out)
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Capture {
            model,
            name,
            prompts,
            out,
            conditions,
            max_tokens,
            batch,
            decode_tokens,
            decode_prompts,
            deep_layer,
            down_prompts,
        } => {
            let conds = conditions
                .iter()
                .map(|c| Condition::parse(c).with_context(|| format!("unknown condition `{c}`")))
                .collect::<Result<Vec<_>>>()?;
            let prompts = read_prompts(&prompts)?;
            let opts = Options {
                model,
                name,
                out,
                max_tokens,
                batch,
                decode_tokens,
                decode_prompts,
                deep_layer,
                down_prompts,
            };
            for cond in conds {
                let t = Instant::now();
                let dir = attack::capture(&opts, cond, &prompts)?;
                eprintln!(
                    "captured {} {} ({} prompts) in {:.1}s -> {}",
                    opts.name,
                    cond.name(),
                    prompts.len(),
                    t.elapsed().as_secs_f64(),
                    dir.display()
                );
            }
            Ok(())
        }
    }
}
