//! The capture run: prompts through a model under one condition, pairing every operand the
//! engine received (`U`, the attacker's view) with the plaintext input the trusted side
//! masked (`H`, kept for scoring only), and writing both as `.npy`.
//!
//! Layout under `out/<model>/<condition>/`, for each phase (`prefill`, `decode`) and site
//! (`l0`, `deep`, `l0_down`, `lm_head`):
//!
//! * `<phase>.<site>.U.npy`  `f32 [rows seen by the engine, d]`; under `dual-lpn`, `u32`:
//!   the words of the ring operand exactly as sent
//! * `<phase>.<site>.H.npy`  `f32 [activation rows, d]` (ground truth)
//! * `<phase>.<site>.Hq.npy` `i8 [activation rows, d]` (`dual-lpn` only, ground truth): the
//!   int8 rows the words mask, quantized as the executor quantizes them
//! * `<phase>.<site>.blocks.npy` `i64 [sequence blocks, 7]`: prompt, pass, first `U` row,
//!   `U` rows (`s`), first `H` row, `H` rows (`n`), position of the first row
//! * `<phase>.<site>.tokens.npy` `i32 [activation rows]`: the token of each `H` row (for
//!   `lm_head`, the token the plaintext logits rank first: what the product reveals)
//!
//! and `meta.json`. The model's public tables (what any attacker can download) go to
//! `out/<model>/public/`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use anyhow::{Context, Result, bail, ensure};
use kernels::{
    CpuEngine,
    capture::{Captured, CapturingEngine, OpKind, Words},
};
use models::{
    LoadOptions, TextGenerator,
    bert::{Bert, BertConfig, Encoded},
    tensors::Tensors,
    tokenizer::TextTokenizer,
};
use protocol::{Engine, EngineError, EngineInfo, Masked, Registered, RingMasked};
use serde::Serialize;
use serde_json::json;
use tensor::{Matrix, Weight, WeightId, ring::RingWeight};

use crate::{
    Condition, npy,
    record::{Recorder, Truth},
};

/// What to capture.
#[derive(Clone, Debug)]
pub struct Options {
    /// A BERT folder (safetensors) or a decoder `.gguf` file / folder.
    pub model: PathBuf,
    /// Short name for the output folder (`minilm`, `smollm2`, …).
    pub name: String,
    pub out: PathBuf,
    /// Prompts are truncated to this many tokens (special tokens included).
    pub max_tokens: usize,
    /// Sequences per forward pass (each with its own mask block).
    pub batch: usize,
    /// Decoders: teacher-forced decode steps per prompt (0: no decode phase).
    pub decode_tokens: usize,
    /// Decoders: only the first this many prompts go through the decode phase.
    pub decode_prompts: usize,
    /// Layer of the deep site (default: three quarters down the stack).
    pub deep_layer: Option<usize>,
    /// Only the first this many prompts record the (wide) `l0_down` site.
    pub down_prompts: usize,
}

/// One prompt of the corpus.
#[derive(Clone, Debug)]
pub struct Prompt {
    pub id: usize,
    pub text: String,
}

/// Where in the model an operand was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Site {
    /// Layer 0's attention input (Q/K/V): the normalized token embeddings.
    L0,
    /// The attention input of a deep layer.
    Deep,
    /// Layer 0's feed-forward down projection input (widest operand, post-activation).
    L0Down,
    /// The LM head's input: final-normed last hidden state, one row per sequence.
    LmHead,
}

impl Site {
    pub fn name(self) -> &'static str {
        match self {
            Site::L0 => "l0",
            Site::Deep => "deep",
            Site::L0Down => "l0_down",
            Site::LmHead => "lm_head",
        }
    }

    /// The site of a linear call, from the first weight id (`{tag}/{checkpoint name}`).
    pub fn of(ids: &[WeightId], deep: usize) -> Option<Site> {
        let id = ids.first()?.as_str();
        let name = id.split_once('/').map_or(id, |(_, n)| n);
        let name = name.strip_prefix("bert.").unwrap_or(name);
        if name == "lm_head" {
            return Some(Site::LmHead);
        }
        let rest = name.strip_prefix("encoder.layer.").or_else(|| name.strip_prefix("model.layers."))?;
        let (layer, op) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        match op {
            "attention.self.query" | "self_attn.q_proj" if layer == 0 => Some(Site::L0),
            "attention.self.query" | "self_attn.q_proj" if layer == deep => Some(Site::Deep),
            "output.dense" | "mlp.down_proj" if layer == 0 => Some(Site::L0Down),
            _ => None,
        }
    }
}

/// One sequence block of a pass, as the trusted side knows it.
struct SeqInfo {
    prompt: usize,
    /// The token of each activation row of the block.
    tokens: Vec<u32>,
    /// Position of the block's first row.
    pos0: usize,
}

/// An operand as the engine received it.
#[derive(Clone, Copy)]
enum Seen<'a> {
    Real(&'a Matrix),
    Ring(&'a Words),
}

impl Seen<'_> {
    fn rows(&self) -> usize {
        match self {
            Seen::Real(m) => m.rows(),
            Seen::Ring(w) => w.rows,
        }
    }

    fn cols(&self) -> usize {
        match self {
            Seen::Real(m) => m.cols(),
            Seen::Ring(w) => w.cols,
        }
    }
}

/// The ring operand of a call the model made (`ids`, `rows` activation rows), skipping the
/// public code `H` the executor sends to have its tables `H·W_q` computed: one weight, `N =
/// 4·d` rows (`protocol`'s dual-LPN `CODE_FACTOR`), at provisioning and at every redraw.
fn ring_operand<'a>(
    ops: &mut impl Iterator<Item = &'a Captured>,
    ids: &[WeightId],
    rows: usize,
    codes: &mut usize,
) -> Result<&'a Captured> {
    for c in ops {
        let (OpKind::Ring(got), Some(w)) = (&c.op, &c.words) else { continue };
        if got == ids && w.rows == rows {
            return Ok(c);
        }
        ensure!(
            got.len() == 1 && w.rows == 4 * w.cols,
            "engine call {} is for {got:?}, the model asked for {ids:?}",
            c.call
        );
        *codes += 1;
    }
    bail!("no ring operand for {ids:?} ({rows} rows)")
}

#[derive(Default)]
struct Buffer {
    d: usize,
    u: Vec<f32>,
    words: Vec<u32>,
    hq: Vec<i8>,
    h: Vec<f32>,
    blocks: Vec<i64>,
    tokens: Vec<i32>,
    u_rows: usize,
    h_rows: usize,
}

impl Buffer {
    fn append(
        &mut self,
        cond: Condition,
        pass: usize,
        u: Seen<'_>,
        h: &Matrix,
        blocks: &[usize],
        seqs: &[SeqInfo],
    ) -> Result<()> {
        ensure!(blocks.len() == seqs.len(), "pass has {} blocks, driver described {}", blocks.len(), seqs.len());
        ensure!(u.cols() == h.cols(), "operand is {}×{}, input {:?}", u.rows(), u.cols(), h.shape());
        if self.d == 0 {
            self.d = u.cols();
        }
        ensure!(self.d == u.cols(), "site width changed from {} to {}", self.d, u.cols());
        for (&n, seq) in blocks.iter().zip(seqs) {
            ensure!(seq.tokens.len() == n, "block of {n} rows described with {} tokens", seq.tokens.len());
        }
        let masked = cond.mask_blocks(blocks);
        let orders: Vec<usize> = masked.iter().map(|&n| cond.order(n)).collect();
        ensure!(
            orders.iter().sum::<usize>() == u.rows(),
            "engine saw {} rows, blocks {masked:?} give {orders:?}",
            u.rows()
        );
        ensure!(blocks.iter().sum::<usize>() == h.rows(), "input has {} rows for blocks {blocks:?}", h.rows());
        let (mut u0, mut h0) = (self.u_rows, self.h_rows);
        // One record per mask block; a shared decode block (several sequences) carries its
        // first sequence's prompt and position, and each row's own token.
        let mut seqs = seqs.iter();
        for (&n, &s) in masked.iter().zip(&orders) {
            let mut rows = 0;
            let mut first = None;
            while rows < n {
                let seq = seqs.next().context("fewer sequences than mask rows")?;
                first.get_or_insert(seq);
                self.tokens.extend(seq.tokens.iter().map(|&t| t as i32));
                rows += seq.tokens.len();
            }
            let seq = first.context("an empty mask block")?;
            self.blocks.extend([seq.prompt, pass, u0, s, h0, n, seq.pos0].map(|v| v as i64));
            u0 += s;
            h0 += n;
        }
        match u {
            Seen::Real(m) => self.u.extend_from_slice(m.as_slice()),
            Seen::Ring(w) => {
                self.words.extend_from_slice(&w.data);
                self.hq.extend(tensor::ring::quantize_rows(h).0);
            }
        }
        self.h.extend_from_slice(h.as_slice());
        self.u_rows = u0;
        self.h_rows = h0;
        Ok(())
    }

    fn write(&self, dir: &Path, stem: &str) -> Result<()> {
        let p = |suffix: &str| dir.join(format!("{stem}.{suffix}.npy"));
        if self.words.is_empty() {
            npy::write(&p("U"), &[self.u_rows, self.d], &self.u)?;
        } else {
            npy::write(&p("U"), &[self.u_rows, self.d], &self.words)?;
            npy::write(&p("Hq"), &[self.h_rows, self.d], &self.hq)?;
        }
        npy::write(&p("H"), &[self.h_rows, self.d], &self.h)?;
        npy::write(&p("blocks"), &[self.blocks.len() / 7, 7], &self.blocks)?;
        npy::write(&p("tokens"), &[self.tokens.len()], &self.tokens)?;
        Ok(())
    }
}

enum Model {
    Bert { bert: Bert, tokenizer: TextTokenizer },
    Decoder(TextGenerator),
}

impl Model {
    fn layers(&self) -> usize {
        match self {
            Model::Bert { bert, .. } => bert.cfg.num_hidden_layers,
            Model::Decoder(g) => g.decoder.cfg.num_layers,
        }
    }

    fn encode(&self, text: &str, max_tokens: usize) -> Result<Vec<u32>> {
        let mut ids = match self {
            Model::Bert { tokenizer, .. } => tokenizer.encode(text, true)?,
            Model::Decoder(g) => g.tokenizer.encode(text, true)?,
        };
        if ids.len() > max_tokens {
            // BERT keeps its closing [SEP], as the embedder's own truncation does.
            let last = *ids.last().expect("non-empty");
            ids.truncate(max_tokens);
            if matches!(self, Model::Bert { .. }) {
                *ids.last_mut().expect("non-empty") = last;
            }
        }
        Ok(ids)
    }
}

fn is_bert(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").exists() && {
        let cfg: serde_json::Value = std::fs::read(path.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        cfg.get("model_type").and_then(|v| v.as_str()) == Some("bert")
    }
}

fn load(path: &Path, exec: Arc<dyn protocol::Executor>) -> Result<Model> {
    if is_bert(path) {
        let cfg: BertConfig = serde_json::from_slice(&std::fs::read(path.join("config.json"))?)?;
        let bert = Bert::load(&Tensors::open(path)?, cfg, exec, "model")?;
        Ok(Model::Bert { bert, tokenizer: TextTokenizer::from_dir(path)? })
    } else {
        Ok(Model::Decoder(models::load_generator(path, exec, &LoadOptions::default())?))
    }
}

/// One condition's capture run.
/// The device as the attacker owns it: every operand it is sent (a [`CapturingEngine`]) and
/// a count of the weights it is handed.
pub struct Watched {
    pub inner: CapturingEngine<CpuEngine>,
    registered: AtomicUsize,
}

impl Watched {
    pub fn new() -> Self {
        Watched { inner: CapturingEngine::new(CpuEngine::new()), registered: AtomicUsize::new(0) }
    }

    /// Weights registered with the engine so far.
    pub fn registered(&self) -> usize {
        self.registered.load(Ordering::SeqCst)
    }
}

impl Default for Watched {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine for Watched {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        self.registered.fetch_add(1, Ordering::SeqCst);
        self.inner.register(id, weight)
    }
    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        self.inner.unregister(id)
    }
    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        self.inner.matmul_many(x, ids)
    }
    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        self.inner.matmul_dynamic(a, b, transpose_b)
    }
    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        self.inner.softmax_rows(x, scale)
    }
    fn register_ring(&self, id: WeightId, weight: Arc<RingWeight>) -> Result<(), EngineError> {
        self.registered.fetch_add(1, Ordering::SeqCst);
        self.inner.register_ring(id, weight)
    }
    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        self.inner.ring_matmul_many(x, ids)
    }
}

/// What the engine received over a run, against what the model computed.
#[derive(Default, Serialize)]
struct Exposure {
    /// Operands the engine received, of any kind (linear, attention, softmax).
    engine_operands: usize,
    /// Linear-layer calls the model made (each one an operand under an offloading scheme).
    model_linear_calls: usize,
    /// Activation rows of those calls.
    model_linear_rows: usize,
    /// `dual-lpn`: operands that were the public code `H` (its tables recomputed at a redraw),
    /// not activations.
    code_operands: usize,
}

impl Exposure {
    fn count(&mut self, seen: &[Captured], truth: &[Truth]) {
        self.engine_operands += seen.len();
        self.model_linear_calls += truth.len();
        self.model_linear_rows += truth.iter().map(|t| t.blocks.iter().sum::<usize>()).sum::<usize>();
    }
}

struct Run<'a> {
    opts: &'a Options,
    cond: Condition,
    engine: Arc<Watched>,
    rec: Arc<Recorder>,
    deep: usize,
    passes: usize,
    buffers: BTreeMap<(String, Site), Buffer>,
    exposure: Exposure,
}

impl Run<'_> {
    /// Pairs the engine's log with the recorder's since the last call and keeps the sites.
    fn collect(&mut self, phase: &str, seqs: &[SeqInfo], keep_down: bool) -> Result<()> {
        let seen = self.engine.inner.take();
        let truth = self.rec.take();
        self.exposure.count(&seen, &truth);
        if seen.is_empty() && self.cond == Condition::Production {
            // The production default kept every product in the TEE: nothing to pair.
            self.passes += 1;
            return Ok(());
        }
        let pass = self.passes;
        self.passes += 1;
        let pairs: Vec<(Seen<'_>, Truth)> = if self.cond.ring() {
            let mut ops = seen.iter();
            let mut codes = 0;
            let pairs = truth
                .into_iter()
                .map(|t| {
                    let c = ring_operand(&mut ops, &t.ids, t.blocks.iter().sum(), &mut codes)?;
                    Ok((Seen::Ring(c.words.as_ref().expect("a ring operand has words")), t))
                })
                .collect::<Result<_>>()?;
            ensure!(ops.all(|c| !matches!(c.op, OpKind::Ring(_))), "ring operands the model did not ask for");
            self.exposure.code_operands += codes;
            pairs
        } else {
            let seen: Vec<_> = seen.iter().filter(|c| matches!(c.op, OpKind::Linear(_))).collect();
            ensure!(
                seen.len() == truth.len(),
                "engine got {} linear calls, the model made {}",
                seen.len(),
                truth.len()
            );
            seen.into_iter()
                .zip(truth)
                .map(|(c, t)| {
                    let OpKind::Linear(ids) = &c.op else { unreachable!() };
                    ensure!(*ids == t.ids, "engine call {} is for {ids:?}, the model asked for {:?}", c.call, t.ids);
                    Ok((Seen::Real(&c.operand), t))
                })
                .collect::<Result<_>>()?
        };
        for (u, t) in pairs {
            let (Some(site), Some(h)) = (Site::of(&t.ids, self.deep), t.input) else { continue };
            if site == Site::L0Down && !keep_down {
                continue;
            }
            let buf = self.buffers.entry((phase.to_string(), site)).or_default();
            buf.append(self.cond, pass, u, &h, &t.blocks, seqs)?;
        }
        Ok(())
    }

    /// Drops what was captured since the last call (a phase another one covers), counting it.
    fn discard(&mut self) {
        let (seen, truth) = (self.engine.inner.take(), self.rec.take());
        self.exposure.count(&seen, &truth);
    }

    fn prefill(&mut self, model: &Model, prompts: &[(usize, Vec<u32>)]) -> Result<()> {
        for chunk in prompts.chunks(self.opts.batch) {
            match model {
                Model::Bert { bert, .. } => {
                    let seqs: Vec<Encoded> =
                        chunk.iter().map(|(_, ids)| Encoded { types: vec![0; ids.len()], ids: ids.clone() }).collect();
                    bert.forward(&seqs)?;
                }
                Model::Decoder(g) => {
                    let mut caches: Vec<_> = chunk.iter().map(|_| g.decoder.new_cache()).collect();
                    let mut refs: Vec<_> = caches.iter_mut().collect();
                    let tokens: Vec<&[u32]> = chunk.iter().map(|(_, t)| t.as_slice()).collect();
                    g.decoder.forward(&mut refs, &tokens)?;
                }
            }
            let infos: Vec<SeqInfo> =
                chunk.iter().map(|(p, t)| SeqInfo { prompt: *p, tokens: t.clone(), pos0: 0 }).collect();
            let keep_down = chunk.iter().any(|(p, _)| *p < self.opts.down_prompts);
            self.collect("prefill", &infos, keep_down)?;
        }
        Ok(())
    }

    /// Batched decode, teacher-forced: each prompt's first part is prefilled, then its last
    /// `decode_tokens` tokens go in one per step, every active sequence in one pass with its
    /// own mask block; each step's last hidden states go through the LM head.
    fn decode(&mut self, g: &TextGenerator, prompts: &[(usize, Vec<u32>)]) -> Result<()> {
        let argmax = |logits: &Matrix| -> Vec<u32> {
            (0..logits.rows())
                .map(|r| {
                    let row = logits.row(r);
                    (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap_or(0) as u32
                })
                .collect()
        };
        let usable: Vec<&(usize, Vec<u32>)> = prompts.iter().filter(|(_, t)| t.len() >= 2).collect();
        for chunk in usable.chunks(self.opts.batch) {
            let steps: Vec<usize> = chunk.iter().map(|(_, t)| self.opts.decode_tokens.min(t.len() - 1)).collect();
            let mut caches: Vec<_> = chunk.iter().map(|_| g.decoder.new_cache()).collect();
            // 1. Prefill the prefixes (not recorded: the prefill phase covers that shape).
            let prefixes: Vec<&[u32]> = chunk.iter().zip(&steps).map(|((_, t), &m)| &t[..t.len() - m]).collect();
            let last = {
                let mut refs: Vec<_> = caches.iter_mut().collect();
                g.decoder.forward(&mut refs, &prefixes)?
            };
            self.discard();
            let logits = g.decoder.logits(&last)?;
            let infos: Vec<SeqInfo> = chunk
                .iter()
                .zip(argmax(&logits))
                .zip(&prefixes)
                .map(|(((p, _), tok), pre)| SeqInfo { prompt: *p, tokens: vec![tok], pos0: pre.len() - 1 })
                .collect();
            self.collect("decode", &infos, false)?;
            // 2. One token per active sequence per step.
            for step in 0..steps.iter().copied().max().unwrap_or(0) {
                let active: Vec<usize> = (0..chunk.len()).filter(|&i| step < steps[i]).collect();
                let fed: Vec<[u32; 1]> = active
                    .iter()
                    .map(|&i| {
                        let t = &chunk[i].1;
                        [t[t.len() - steps[i] + step]]
                    })
                    .collect();
                let infos: Vec<SeqInfo> = active
                    .iter()
                    .zip(&fed)
                    .map(|(&i, f)| SeqInfo { prompt: chunk[i].0, tokens: f.to_vec(), pos0: caches[i].len() })
                    .collect();
                let last = {
                    let mut refs: Vec<_> =
                        caches.iter_mut().enumerate().filter(|(i, _)| active.contains(i)).map(|(_, c)| c).collect();
                    let tokens: Vec<&[u32]> = fed.iter().map(|f| f.as_slice()).collect();
                    g.decoder.forward(&mut refs, &tokens)?
                };
                self.collect("decode", &infos, false)?;
                let logits = g.decoder.logits(&last)?;
                let infos: Vec<SeqInfo> = infos
                    .iter()
                    .zip(argmax(&logits))
                    .map(|(s, tok)| SeqInfo { prompt: s.prompt, tokens: vec![tok], pos0: s.pos0 })
                    .collect();
                self.collect("decode", &infos, false)?;
            }
        }
        Ok(())
    }
}

/// The model's public tables: what any attacker downloads with the open weights.
fn write_public(path: &Path, dir: &Path, model: &Model, deep: usize) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let t = Tensors::open(path)?;
    let mut files = BTreeMap::new();
    let mut put = |key: &str, name: &str, shape: &[usize]| -> Result<()> {
        let data = t.f32(name, shape).with_context(|| format!("public tensor {name}"))?;
        npy::write(&dir.join(format!("{key}.npy")), shape, &data)?;
        files.insert(key.to_string(), name.to_string());
        Ok(())
    };
    let meta = match model {
        Model::Bert { bert, tokenizer } => {
            let c = &bert.cfg;
            let p = if t.has("bert.embeddings.word_embeddings.weight") { "bert." } else { "" };
            let d = c.hidden_size;
            put("word", &format!("{p}embeddings.word_embeddings.weight"), &[c.vocab_size, d])?;
            put("position", &format!("{p}embeddings.position_embeddings.weight"), &[c.max_position_embeddings, d])?;
            put("token_type", &format!("{p}embeddings.token_type_embeddings.weight"), &[c.type_vocab_size, d])?;
            put("ln_weight", &format!("{p}embeddings.LayerNorm.weight"), &[d])?;
            put("ln_bias", &format!("{p}embeddings.LayerNorm.bias"), &[d])?;
            json!({
                "arch": "bert", "hidden": d, "vocab": c.vocab_size, "layers": c.num_hidden_layers,
                "deep_layer": deep, "eps": c.layer_norm_eps, "special": tokenizer.encode("", true)?,
                "tied_lm_head": false,
            })
        }
        Model::Decoder(g) => {
            let c = &g.decoder.cfg;
            let d = c.hidden_size;
            put("embed", "model.embed_tokens.weight", &[c.vocab_size, d])?;
            put("norm_l0", "model.layers.0.input_layernorm.weight", &[d])?;
            put("norm_deep", &format!("model.layers.{deep}.input_layernorm.weight"), &[d])?;
            put("final_norm", "model.norm.weight", &[d])?;
            let tied = c.tie_embeddings || !t.has("lm_head.weight");
            if !tied {
                put("lm_head", "lm_head.weight", &[c.vocab_size, d])?;
            }
            let mut special = g.tokenizer.encode("", true)?;
            special.extend(g.tokenizer.bos);
            special.extend(&g.tokenizer.eos);
            special.sort_unstable();
            special.dedup();
            json!({
                "arch": c.arch, "hidden": d, "vocab": c.vocab_size, "layers": c.num_layers,
                "deep_layer": deep, "eps": c.rms_norm_eps, "special": special, "tied_lm_head": tied,
            })
        }
    };
    let mut meta = meta;
    meta["tensors"] = serde_json::to_value(&files)?;
    std::fs::write(dir.join("public.json"), serde_json::to_vec_pretty(&meta)?)?;
    Ok(())
}

#[derive(Serialize)]
struct SiteSummary {
    phase: String,
    site: &'static str,
    width: usize,
    operand_rows: usize,
    activation_rows: usize,
    blocks: usize,
}

/// Captures one condition for every prompt; returns the output folder.
pub fn capture(opts: &Options, cond: Condition, prompts: &[Prompt]) -> Result<PathBuf> {
    if opts.batch == 0 || opts.max_tokens < 2 {
        bail!("batch must be ≥ 1 and max_tokens ≥ 2");
    }
    let engine = Arc::new(Watched::new());
    let dyn_engine: Arc<dyn Engine> = engine.clone();
    let exec = cond.executor(dyn_engine)?;
    // The recorder decides what to keep by site, and the deep site depends on the layer
    // count, known only once the model is loaded (loading makes no linear calls).
    let deep_cell = Arc::new(AtomicUsize::new(usize::MAX));
    let keep_deep = deep_cell.clone();
    let rec = Arc::new(Recorder::new(exec, move |ids| Site::of(ids, keep_deep.load(Ordering::Relaxed)).is_some()));
    let model = load(&opts.model, rec.clone())?;
    let deep = opts.deep_layer.unwrap_or(3 * model.layers() / 4);
    ensure!(deep < model.layers(), "deep layer {deep} but the model has {} layers", model.layers());
    deep_cell.store(deep, Ordering::Relaxed);
    let root = opts.out.join(&opts.name);
    let public = root.join("public");
    if !public.join("public.json").exists() {
        write_public(&opts.model, &public, &model, deep)?;
    }
    engine.inner.take();
    rec.take();

    let encoded: Vec<(usize, Vec<u32>)> =
        prompts.iter().map(|p| Ok((p.id, model.encode(&p.text, opts.max_tokens)?))).collect::<Result<_>>()?;
    let mut run =
        Run { opts, cond, engine, rec, deep, passes: 0, buffers: BTreeMap::new(), exposure: Exposure::default() };
    run.prefill(&model, &encoded)?;
    if let (Model::Decoder(g), true) = (&model, opts.decode_tokens > 0) {
        let n = opts.decode_prompts.min(encoded.len());
        run.decode(g, &encoded[..n])?;
    }

    let dir = root.join(cond.name());
    std::fs::create_dir_all(&dir)?;
    let mut sites = Vec::new();
    for ((phase, site), buf) in &run.buffers {
        buf.write(&dir, &format!("{phase}.{}", site.name()))?;
        sites.push(SiteSummary {
            phase: phase.clone(),
            site: site.name(),
            width: buf.d,
            operand_rows: buf.u_rows,
            activation_rows: buf.h_rows,
            blocks: buf.blocks.len() / 7,
        });
    }
    let cfg = cond.config();
    let meta = json!({
        "condition": cond.name(),
        "ring": cond.ring(),
        "mask": cfg.map(|c| c.mask),
        "shield": cfg.map(|c| c.shield),
        "model": opts.name,
        "deep_layer": deep,
        "batch": opts.batch,
        "max_tokens": opts.max_tokens,
        "decode_tokens": opts.decode_tokens,
        "prompts": prompts.len(),
        "passes": run.passes,
        "sites": sites,
        "exposure": run.exposure,
        "engine_weights": run.engine.registered(),
    });
    std::fs::write(dir.join("meta.json"), serde_json::to_vec_pretty(&meta)?)?;
    Ok(dir)
}
