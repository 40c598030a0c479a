//! `gelo bench sealed`: the default protection's speed on a real model, on the workloads its
//! CPU peers run (`scripts/bench/llama_cpp_peer.py`, `scripts/bench/bert_peers.py`), so
//! `scripts/bench/peers.sh` can print ratios from one run on one machine.
//!
//! A generator: prefill of one `--prompt`-token prompt (tokens/s to its last logits), then
//! greedy decode of `--steps` tokens for each `--batch` size after `--context` prompt tokens
//! per sequence (aggregate tokens/s). An embedder: `--texts` texts of exactly `--n` tokens
//! per forward pass (texts/s). Threads: `RAYON_NUM_THREADS` (the compute pool follows it).

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use models::sampler::argmax;
use protocol::{Executor, SealedExecutor};

use crate::profile::{Spent, Taken, Timed};

#[derive(clap::Args)]
pub struct SealedArgs {
    /// A GGUF decoder, or a BERT embedder's folder.
    #[arg(long)]
    model: PathBuf,
    /// Prefill prompt length (generator).
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Prompt tokens per sequence before decoding (generator).
    #[arg(long, default_value_t = 32)]
    context: usize,
    /// Decode steps timed (generator).
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Decode batch sizes (generator).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    batch: Vec<usize>,
    /// Texts per forward pass (embedder).
    #[arg(long, default_value_t = 32)]
    texts: usize,
    /// Tokens per text (embedder).
    #[arg(long, default_value_t = 256)]
    n: usize,
    /// Timed repetitions per cell (medians reported), after one warm-up.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Also write the cells as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Split each cell's time into the products, attention and the model code between them
    /// (`crate::profile`), printed and written as `<cell>_{linear_ms,attend_ms,rest_ms,page_faults}` per repetition.
    #[arg(long)]
    profile: bool,
}

/// The project's deterministic prompt ids (the peers use the same formula): away from
/// both ends of the vocabulary, where the special tokens sit.
fn prompt_ids(count: usize, vocab: usize, salt: usize) -> Vec<u32> {
    let lo = 1000.min(vocab / 4);
    (0..count).map(|i| (lo + (i * 7919 + salt * 104_729) % (vocab - 2 * lo)) as u32).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `VmRSS` and `VmHWM` of this process, in bytes (Linux).
fn memory() -> (u64, u64) {
    let m = status_fields(&["VmRSS:", "VmHWM:"]);
    (m[0], m[1])
}

/// Fields of `/proc/self/status` in bytes (0 where absent).
fn status_fields(keys: &[&str]) -> Vec<u64> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    keys.iter().map(|k| field(k)).collect()
}

pub fn run(a: SealedArgs) -> Result<()> {
    let spent = Arc::new(Spent::default());
    let exec: Arc<dyn Executor> = if a.profile {
        Arc::new(Timed { inner: Arc::new(SealedExecutor::new()), spent: spent.clone() })
    } else {
        Arc::new(SealedExecutor::new())
    };
    let files = models::ModelFiles::inspect(&a.model, None)?;
    let name = a.model.file_name().map_or_else(|| "model".into(), |f| f.to_string_lossy().into_owned());
    let threads = tensor::pool::global().threads();
    let mut cells = Cells { name: name.clone(), threads, map: serde_json::Map::new() };
    match files.kind {
        models::Kind::Bert { .. } => embedder(&a, exec, &spent, &mut cells)?,
        models::Kind::Decoder(_) => generator(&a, exec, &spent, &mut cells)?,
    }
    let cells = cells.map;
    if let Some(path) = &a.json {
        let doc = serde_json::json!({
            "runtime": "GELO sealed",
            "model": name,
            "threads": threads,
            "isa": tensor::quant::Isa::detected().name(),
            "prompt": a.prompt, "context": a.context, "steps": a.steps,
            "cells": cells,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

/// The cells of one run, printed as they come and kept for the JSON.
struct Cells {
    name: String,
    threads: usize,
    map: serde_json::Map<String, serde_json::Value>,
}

impl Cells {
    fn put(&mut self, k: &str, v: f64, unit: &str) {
        println!("| GELO sealed | {} | {k} | {v:.1} {unit} | {} threads |", self.name, self.threads);
        self.map.insert(k.into(), v.into());
    }
}

/// An embedder's cell: `--texts` texts of `--n` tokens a pass.
fn embedder(a: &SealedArgs, exec: Arc<dyn Executor>, spent: &Spent, cells: &mut Cells) -> Result<()> {
    let opts = models::LoadOptions { max_seq_length: Some(a.n), ..Default::default() };
    let e = models::load_embedder(&a.model, exec, &opts)?;
    // Tokenized once, outside the timed passes, as the peers are given token ids.
    let inputs = (0..a.texts).map(|i| Ok(e.tokenize(&long_text(i, a.n), a.n)?.tokens)).collect::<Result<Vec<_>>>()?;
    e.embed_tokens(&inputs)?;
    spent.take();
    let mut wall = Duration::ZERO;
    let rates = (0..a.reps)
        .map(|_| {
            let t = Instant::now();
            e.embed_tokens(&inputs)?;
            wall += t.elapsed();
            Ok(a.texts as f64 / t.elapsed().as_secs_f64())
        })
        .collect::<Result<Vec<_>>>()?;
    let cell = format!("embed_{}x{}", a.texts, a.n);
    cells.put(&cell, median(rates), "texts/s");
    if a.profile {
        report(&mut cells.map, &cell, wall / a.reps as u32, spent.take(), a.reps);
    }
    Ok(())
}

/// A generator's cells: prefill, then decode at each batch size, and its memory.
fn generator(a: &SealedArgs, exec: Arc<dyn Executor>, spent: &Spent, cells: &mut Cells) -> Result<()> {
    // The process before the model (binary, runtime, pool): what the model adds is
    // the difference.
    let (rss_before, _) = memory();
    let g = models::load_generator(&a.model, exec, &models::LoadOptions::default())?;
    let (rss_loaded, _) = memory();
    // Heap and mapped-file pages apart: a mapped model's pages count once touched.
    let split = status_fields(&["RssAnon:", "RssFile:"]);
    println!(
        "memory after load: anonymous {:.1} MB, file-backed {:.1} MB",
        split[0] as f64 / 1e6,
        split[1] as f64 / 1e6
    );
    let d = &g.decoder;
    let vocab = d.cfg.vocab_size;
    let prefill = |n: usize| -> Result<f64> {
        let mut cache = d.new_cache();
        let toks = prompt_ids(n, vocab, 0);
        let t = Instant::now();
        let last = d.forward(&mut [&mut cache], &[&toks])?;
        d.logits(&last)?;
        Ok(n as f64 / t.elapsed().as_secs_f64())
    };
    prefill(a.prompt.min(64))?;
    spent.take();
    let t = Instant::now();
    let rate = median((0..a.reps).map(|_| prefill(a.prompt)).collect::<Result<_>>()?);
    let wall = t.elapsed();
    cells.put("prefill", rate, "tok/s");
    let mut profiles = vec![("prefill".to_string(), wall / a.reps as u32, spent.take())];
    let mut kv_bytes = 0;
    for &b in &a.batch {
        // The steps' rate, and the executor's time within them (not the prompts').
        let decode = |steps: usize, kv: &mut usize| -> Result<(f64, Taken)> {
            let mut caches: Vec<_> = (0..b).map(|_| d.new_cache()).collect();
            let mut next = Vec::with_capacity(b);
            for (s, c) in caches.iter_mut().enumerate() {
                let last = d.forward(&mut [c], &[&prompt_ids(a.context, vocab, s)])?;
                next.push(argmax(d.logits(&last)?.row(0)));
            }
            spent.take();
            let t = Instant::now();
            crate::model::greedy_steps(d, &mut caches, &mut next, steps)?;
            let elapsed = t.elapsed();
            *kv = (*kv).max(caches.iter().map(|c| c.bytes()).sum());
            Ok(((b * steps) as f64 / elapsed.as_secs_f64(), spent.take()))
        };
        decode(2, &mut kv_bytes)?;
        let runs = (0..a.reps).map(|_| decode(a.steps, &mut kv_bytes)).collect::<Result<Vec<_>>>()?;
        let rates: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let wall = rates.iter().map(|r| Duration::from_secs_f64((b * a.steps) as f64 / r)).sum::<Duration>();
        let taken = runs.iter().fold(Taken::default(), |acc, r| acc + r.1);
        let cell = format!("decode_b{b}");
        cells.put(&cell, median(rates), "tok/s");
        profiles.push((cell, wall / a.reps as u32, taken));
    }
    if a.profile {
        for (cell, wall, taken) in profiles {
            report(&mut cells.map, &cell, wall, taken, a.reps);
        }
    }
    let (rss, hwm) = memory();
    let file = std::fs::metadata(&a.model).map(|m| m.len()).unwrap_or(0);
    println!(
        "memory: file {:.1} MB, resident before load {:.1} MB, after load {:.1} MB (model {:.2}× the file), at end {:.1} MB, peak {:.1} MB, KV cache (largest batch) {:.1} MB",
        file as f64 / 1e6,
        rss_before as f64 / 1e6,
        rss_loaded as f64 / 1e6,
        rss_loaded.saturating_sub(rss_before) as f64 / file.max(1) as f64,
        rss as f64 / 1e6,
        hwm as f64 / 1e6,
        kv_bytes as f64 / 1e6
    );
    for (k, v) in [
        ("file_bytes", file),
        ("rss_before", rss_before),
        ("rss_loaded", rss_loaded),
        ("rss_end", rss),
        ("rss_peak", hwm),
        ("kv_bytes", kv_bytes as u64),
    ] {
        cells.map.insert(k.into(), v.into());
    }
    Ok(())
}

/// Prints and records `cell`'s time per repetition (`wall`) split into the products,
/// attention and the rest, from the executor's time over `reps` repetitions.
fn report(cells: &mut serde_json::Map<String, serde_json::Value>, cell: &str, wall: Duration, t: Taken, reps: usize) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (linear, attend) = (ms(t.linear) / reps as f64, ms(t.attend) / reps as f64);
    let rest = (ms(wall) - linear - attend).max(0.0);
    let faults = t.faults as f64 / reps as f64;
    println!(
        "profile {cell}: {:.2} ms a repetition: products {linear:.2} ms, attention {attend:.2} ms, rest {rest:.2} ms; {faults:.0} page faults",
        ms(wall)
    );
    for (k, v) in [("linear_ms", linear), ("attend_ms", attend), ("rest_ms", rest), ("page_faults", faults)] {
        cells.insert(format!("{cell}_{k}"), v.into());
    }
}

/// A text of well over `n` tokens for any tokenizer (the embedder cuts it to `n`), distinct
/// per `i`.
fn long_text(i: usize, n: usize) -> String {
    (0..n).fold(format!("Record {i}: "), |mut t, k| {
        t.push_str(&format!(
            "the patient cohort {} showed outcome {} after treatment {}; ",
            i + k,
            (i * 31 + k) % 97,
            k % 13
        ));
        t
    })
}
