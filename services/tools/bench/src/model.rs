//! `gelo bench model`: whole-model forward passes, a baseline (`plain` on the same engine,
//! or `sealed` on the host's cores) against a protection (`masked` or `dual-lpn`) on one
//! engine kind, interleaved so drift hits both alike; engine vs TEE time from a timed engine
//! wrapper. Either a real model from disk (`--model PATH`: an embedder's texts/s, a
//! generator's decode tok/s and time to first token) or random weights at a named model's
//! real shapes (`--arch`).

use std::{path::PathBuf, sync::Arc, time::Instant};

use anyhow::{Result, bail};
use kernels::timing::TimedEngine;
use kernels_wgpu::{CallStats, WgpuConfig, WgpuEngine};
use models::{
    bert::Encoded,
    random::{self, Arch},
    sampler::argmax,
};
use protocol::Engine;
use protocol::{
    DecodeMasks, DualLpnConfig, DualLpnCounts, DualLpnExecutor, Executor, MaskKind, MaskedConfig, MaskedExecutor,
    PlaintextExecutor, Protection, ProtocolSeconds, UVerifyConfig,
};

/// What the protection is measured against.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// Every activation sent to the same engine in the clear.
    Plain,
    /// The default protection: every product on the host's own cores, no engine.
    Sealed,
}

#[derive(clap::Args)]
pub struct ModelArgs {
    /// Random weights at the shapes of bert-base, qwen3-0.6b or qwen3-1.7b.
    #[arg(long, default_value = "bert-base")]
    arch: String,
    /// A real model instead (a BERT embedder folder, or a decoder: GGUF file or folder);
    /// `--n` is then its max sequence length (texts are cut to it).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Engine spec (cpu, vulkan, vulkan:N).
    #[arg(long, default_value = "cpu")]
    engine: String,
    /// The protection measured: masked or dual-lpn (on `--engine`).
    #[arg(long, default_value = "masked")]
    protection: Protection,
    /// What it is measured against: plain (the same engine, in the clear) or sealed (the
    /// host's cores; `--engine` is then the protection's alone).
    #[arg(long, value_enum, default_value = "plain")]
    baseline: Baseline,
    /// Mask family of the masked runs.
    #[arg(long, default_value = "auto")]
    mask: MaskKind,
    /// Decode-step masks of the masked runs: per-sequence or shared.
    #[arg(long, default_value = "per-sequence")]
    decode_masks: DecodeMasks,
    /// U-Verify probes in the masked runs (0: off).
    #[arg(long, default_value_t = 0)]
    verify_probes: usize,
    /// Sequences per forward pass (embedding) or decode batch sizes (with --decode).
    #[arg(long, value_delimiter = ',', default_value = "32")]
    batch: Vec<usize>,
    /// Tokens per sequence (embedding).
    #[arg(long, value_delimiter = ',', default_value = "128,256,512")]
    n: Vec<usize>,
    /// Measure decode instead: prefill `--prompt` tokens, then `--steps` decode steps.
    #[arg(long)]
    decode: bool,
    #[arg(long, default_value_t = 32)]
    prompt: usize,
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Timed repetitions per cell (medians reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Storage of the random f32 weights on a Vulkan engine: f32, f16 or bf16 (bf16 is how
    /// Qwen3 checkpoints ship; each value is rounded once, at registration).
    #[arg(long, default_value = "f32")]
    weights: String,
    /// Microseconds an engine call polls the GPU without sleeping before it blocks
    /// (default: the engine's, 1000 on hardware GPUs).
    #[arg(long)]
    engine_spin_us: Option<u64>,
    /// Groups a batched decode step runs as, concurrently (with --decode; a list measures
    /// each in turn in one process).
    #[arg(long, value_delimiter = ',', default_value = "2")]
    decode_groups: Vec<usize>,
    /// Let a Vulkan engine use the matrix units (cooperative matrices, f16 operands) where
    /// the device has them; autotuning still picks per product shape.
    #[arg(long)]
    tensor_cores: bool,
}

struct Side {
    timed: Arc<TimedEngine<Arc<dyn Engine>>>,
    /// The Vulkan engine under `timed`, for its GPU kernel time (`None` on the CPU engine).
    gpu: Option<Arc<WgpuEngine>>,
    exec: Arc<dyn Executor>,
    masked: Option<Arc<MaskedExecutor>>,
    lpn: Option<Arc<DualLpnExecutor>>,
}

/// Where one timed run's seconds went.
#[derive(Clone, Copy, Default)]
struct Sample {
    secs: f64,
    engine: f64,
    /// GPU kernel time inside the engine calls (NaN where not measured); the rest of the
    /// engine time is host packing, transfers, driver and waiting.
    kernels: f64,
    /// Masked side only: shield rows and mask application, then check and recovery.
    mask: f64,
    recover: f64,
    /// Vulkan engine only: the calls' own accounting (zero elsewhere).
    calls: CallStats,
}

struct Mark(Instant, f64, ProtocolSeconds, f64, CallStats);

impl Side {
    fn protocol(&self) -> ProtocolSeconds {
        self.masked.as_ref().map(|m| m.protocol_seconds()).unwrap_or_default()
    }

    fn kernel_seconds(&self) -> f64 {
        match &self.gpu {
            Some(g) if g.has_gpu_timestamps() => g.stats().gpu_ns as f64 * 1e-9,
            _ => f64::NAN,
        }
    }

    fn call_stats(&self) -> CallStats {
        self.gpu.as_ref().map(|g| g.stats()).unwrap_or_default()
    }

    fn mark(&self) -> Mark {
        Mark(Instant::now(), self.timed.seconds(), self.protocol(), self.kernel_seconds(), self.call_stats())
    }

    fn since(&self, m: &Mark) -> Sample {
        let p = self.protocol();
        Sample {
            secs: m.0.elapsed().as_secs_f64(),
            engine: self.timed.seconds() - m.1,
            kernels: self.kernel_seconds() - m.3,
            mask: p.mask - m.2.mask,
            recover: p.recover - m.2.recover,
            calls: self.call_stats().since(&m.4),
        }
    }
}

/// The time shares the table prints after the rates: each side's engine share and the GPU
/// kernels' share within it, then the masked pass's mask and recover shares.
fn shares(plain: &[Sample], masked: &[Sample]) -> String {
    let share = |v: &[Sample], f: fn(&Sample) -> f64| 100.0 * median(v.iter().map(|s| f(s) / s.secs).collect());
    let pct = |x: f64| if x.is_finite() { format!("{x:.0}%") } else { "–".into() };
    format!(
        "{} | {} | {} | {} | {} | {}",
        pct(share(plain, |s| s.engine)),
        pct(share(plain, |s| s.kernels)),
        pct(share(masked, |s| s.engine)),
        pct(share(masked, |s| s.kernels)),
        pct(share(masked, |s| s.mask)),
        pct(share(masked, |s| s.recover))
    )
}

/// The share columns' header, named by the sides; a side's time outside its engine calls
/// is the TEE's own (mask and recover shares: the masked protection only).
fn share_header(a: &ModelArgs) -> String {
    let (b, p) = labels(a);
    format!(
        "{b} engine share | {b} GPU kernels | {p} engine share | {p} GPU kernels | {p} mask share | {p} recover share |"
    )
}

const SHARE_RULE: &str = "---|---|---|---|---|---|";

/// The header of an embedding (or prefill) table.
fn pass_header(a: &ModelArgs) -> String {
    let (b, p) = labels(a);
    format!("| model | batch × n | {b} texts/s | {p} texts/s | {p}/{b} time | {}", share_header(a))
}

/// The dual-LPN executor's counts so far (stderr): the TEE's multiply-adds against the
/// engine's, the analysis' ratio.
fn lpn_counts(side: &Side, what: &str) {
    if let Some(l) = &side.lpn {
        let DualLpnCounts { rows, mask_macs, unmask_macs, engine_macs, codes_drawn, .. } = l.counts();
        let tee = mask_macs + unmask_macs;
        eprintln!(
            "{what}: dual-lpn so far {rows} masked rows, TEE {:.3} G multiply-adds against the engine's {:.3} G ({:.3}×), {codes_drawn} codes, {:.2} GB held",
            tee as f64 * 1e-9,
            engine_macs as f64 * 1e-9,
            tee as f64 / engine_macs.max(1) as f64,
            l.table_bytes_held() as f64 * 1e-9
        );
    }
}

/// The two sides' names, as the tables head their columns.
fn labels(a: &ModelArgs) -> (&'static str, &'static str) {
    let base = if a.baseline == Baseline::Sealed { "sealed" } else { "plain" };
    (base, a.protection.as_str())
}

/// A side's engine, and the same engine as the Vulkan one where it is (for its GPU time).
type Opened = (Arc<dyn Engine>, Option<Arc<WgpuEngine>>);

/// The engine a side multiplies on: the CPU engine, or the Vulkan one `--engine` names.
fn open_engine(a: &ModelArgs) -> Result<Opened> {
    if a.engine.trim().eq_ignore_ascii_case("cpu") {
        return Ok((Arc::new(kernels::CpuEngine::new()), None));
    }
    let f32_weights_as = match a.weights.as_str() {
        "f32" => tensor::Precision::F32,
        "f16" => tensor::Precision::F16,
        "bf16" => tensor::Precision::Bf16,
        other => bail!("--weights {other}: expected f32, f16 or bf16"),
    };
    let cfg = WgpuConfig {
        f32_weights_as,
        spin_wait: a.engine_spin_us.map(std::time::Duration::from_micros),
        tensor_cores: a.tensor_cores,
        ..WgpuConfig::default()
    };
    let g = Arc::new(WgpuEngine::open(&a.engine, cfg)?);
    if a.protection == Protection::DualLpn {
        eprintln!("ring kernel: {:?} (set {} to u32 or dot4)", g.ring_kernel(), kernels_wgpu::RING_KERNEL_ENV);
    }
    Ok((g.clone(), Some(g)))
}

/// The baseline side, then the protected side.
fn sides(a: &ModelArgs) -> Result<(Side, Side)> {
    let base = if a.baseline == Baseline::Sealed {
        // No engine is called: its timer stays at zero, and the sealed products run on the
        // host's cores as a service runs them.
        let timed = Arc::new(TimedEngine::new(Arc::new(kernels::CpuEngine::new()) as Arc<dyn Engine>));
        let exec = Protection::Sealed.executor(timed.clone(), MaskedConfig::default())?;
        Side { timed, gpu: None, exec, masked: None, lpn: None }
    } else {
        let (inner, gpu) = open_engine(a)?;
        let timed = Arc::new(TimedEngine::new(inner));
        Side { timed: timed.clone(), gpu, exec: Arc::new(PlaintextExecutor::new(timed)), masked: None, lpn: None }
    };
    let (inner, gpu) = open_engine(a)?;
    let timed = Arc::new(TimedEngine::new(inner));
    let engine: Arc<dyn Engine> = timed.clone();
    let protected = match a.protection {
        Protection::Masked => {
            let verify = (a.verify_probes > 0).then_some(UVerifyConfig { probes: a.verify_probes, range: 3 });
            let m = Arc::new(MaskedExecutor::new(
                engine,
                MaskedConfig { mask: a.mask, verify, decode_masks: a.decode_masks, ..Default::default() },
            )?);
            Side { timed, gpu, exec: m.clone(), masked: Some(m), lpn: None }
        }
        Protection::DualLpn => {
            let l = Arc::new(DualLpnExecutor::new(engine, DualLpnConfig::default())?);
            Side { timed, gpu, exec: l.clone(), masked: None, lpn: Some(l) }
        }
        Protection::Sealed => bail!("--protection sealed: measure it as --baseline sealed"),
    };
    Ok((base, protected))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn tokens(count: usize, vocab: usize, salt: usize) -> Vec<u32> {
    // Deterministic ids away from the special-token range.
    (0..count).map(|i| (1000 + (i * 7919 + salt * 104_729) % (vocab - 2000)) as u32).collect()
}

pub fn run(a: ModelArgs) -> Result<()> {
    if let Some(path) = a.model.clone() {
        return real_model(&a, &path);
    }
    let Some(arch) = random::by_name(&a.arch) else { bail!("unknown arch {}", a.arch) };
    let (plain, masked) = sides(&a)?;
    let t = Instant::now();
    eprintln!("building {} twice with random weights on {}...", a.arch, a.engine);
    if a.tensor_cores && masked.timed.info().operand_precision != tensor::Precision::F16 {
        eprintln!("tensor cores: not available on this adapter (no usable cooperative matrices); FMA kernels only");
    }
    match arch {
        Arch::Bert(cfg) => {
            let vocab = cfg.vocab_size;
            let mp = random::bert(cfg.clone(), plain.exec.clone(), 1)?;
            let mm = random::bert(cfg, masked.exec.clone(), 1)?;
            eprintln!("provisioned in {:.1}s", t.elapsed().as_secs_f64());
            println!("{}", pass_header(&a));
            println!("|---|---|---|---|---|{SHARE_RULE}");
            for &b in &a.batch {
                for &n in &a.n {
                    let seqs: Vec<Encoded> = (0..b)
                        .map(|i| {
                            let ids = tokens(n, vocab, i);
                            Encoded { types: vec![0; ids.len()], ids }
                        })
                        .collect();
                    let run = |m: &models::bert::Bert, side: &Side| -> Result<Sample> {
                        let mark = side.mark();
                        m.forward(&seqs)?;
                        Ok(side.since(&mark))
                    };
                    cells(&a, &masked, &a.arch, b, n, || run(&mp, &plain), || run(&mm, &masked))?;
                }
            }
        }
        Arch::Decoder(cfg) => {
            let vocab = cfg.vocab_size;
            let mut dp = random::decoder(cfg.clone(), plain.exec.clone(), 1)?;
            let mut dm = random::decoder(cfg, masked.exec.clone(), 1)?;
            eprintln!("provisioned in {:.1}s", t.elapsed().as_secs_f64());
            if a.decode {
                decode_table(&a, &a.arch, &mut dp, &mut dm, &plain, &masked)?;
            } else {
                println!("{}", pass_header(&a));
                println!("|---|---|---|---|---|{SHARE_RULE}");
                for &b in &a.batch {
                    for &n in &a.n {
                        let toks: Vec<Vec<u32>> = (0..b).map(|i| tokens(n, vocab, i)).collect();
                        let run = |d: &models::decoder::Decoder, side: &Side| -> Result<Sample> {
                            let mut caches: Vec<_> = (0..b).map(|_| d.new_cache()).collect();
                            let mut refs: Vec<_> = caches.iter_mut().collect();
                            let slices: Vec<&[u32]> = toks.iter().map(Vec::as_slice).collect();
                            let mark = side.mark();
                            d.forward(&mut refs, &slices)?;
                            Ok(side.since(&mark))
                        };
                        cells(&a, &masked, &a.arch, b, n, || run(&dp, &plain), || run(&dm, &masked))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Per engine call of the median run: calls per step (or pass), then microseconds of host packing and
/// submission, of waiting beyond the kernels, of the kernels (GPU timestamps) and of copying
/// results out; `None` off the Vulkan engine.
fn call_breakdown(v: &[Sample], steps: usize) -> Option<String> {
    let mid = {
        let mut by: Vec<&Sample> = v.iter().collect();
        by.sort_by(|x, y| x.secs.total_cmp(&y.secs));
        by[by.len() / 2]
    };
    let c = mid.calls;
    if c.calls == 0 {
        return None;
    }
    let per = |ns: u64| ns as f64 / c.calls as f64 / 1e3;
    Some(format!(
        "{:.0} calls/step; per call {:.1} µs host, {:.1} µs waiting beyond the kernels, {:.1} µs kernels, {:.1} µs read-back; {:.0} KiB up, {:.0} KiB down",
        c.calls as f64 / steps.max(1) as f64,
        per(c.host_ns),
        per(c.wait_ns.saturating_sub(c.gpu_ns)),
        per(c.gpu_ns),
        per(c.readback_ns),
        c.bytes_up as f64 / c.calls as f64 / 1024.0,
        c.bytes_down as f64 / c.calls as f64 / 1024.0,
    ))
}

/// Times plain and masked alternately and prints one row.
#[allow(clippy::too_many_arguments)]
fn cells(
    a: &ModelArgs,
    masked_side: &Side,
    name: &str,
    b: usize,
    n: usize,
    mut plain: impl FnMut() -> Result<Sample>,
    mut masked: impl FnMut() -> Result<Sample>,
) -> Result<()> {
    plain()?;
    masked()?;
    if let Some(m) = &masked_side.masked {
        eprintln!(
            "{name} {b} × {n}: mask family {:?} ({:?} requested; cost model {:?})",
            m.family_for(n),
            a.mask,
            protocol::mask::CostModel::measured()
        );
    }
    let (mut sp, mut sm) = (Vec::new(), Vec::new());
    for _ in 0..a.reps {
        sp.push(plain()?);
        sm.push(masked()?);
    }
    let (tp, tm) = (median(sp.iter().map(|s| s.secs).collect()), median(sm.iter().map(|s| s.secs).collect()));
    let (bl, pl) = labels(a);
    for (side, v) in [(bl, &sp), (pl, &sm)] {
        if let Some(line) = call_breakdown(v, 1) {
            eprintln!("{name} {b} × {n} {side} (per pass): {line}");
        }
    }
    println!(
        "| {name} | {b} × {n} | {:.1} | {:.1} | {:.3} | {} |",
        b as f64 / tp,
        b as f64 / tm,
        tm / tp,
        shares(&sp, &sm)
    );
    lpn_counts(masked_side, &format!("{name} {b} × {n}"));
    Ok(())
}

/// Prefill `b` prompts, then `steps` greedy decode steps; returns where the decode's
/// seconds went, and the time to first token.
fn decode(
    d: &models::decoder::Decoder,
    side: &Side,
    b: usize,
    prompt: usize,
    steps: usize,
    vocab: usize,
) -> Result<(Sample, f64)> {
    let mut caches: Vec<_> = (0..b).map(|_| d.new_cache()).collect();
    let toks: Vec<Vec<u32>> = (0..b).map(|i| tokens(prompt, vocab, i)).collect();
    let t = Instant::now();
    let last = {
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let slices: Vec<&[u32]> = toks.iter().map(Vec::as_slice).collect();
        d.forward(&mut refs, &slices)?
    };
    let logits = d.logits(&last)?;
    let mut next: Vec<u32> = (0..b).map(|r| argmax(logits.row(r))).collect();
    let ttft = t.elapsed().as_secs_f64();
    let mark = side.mark();
    greedy_steps(d, &mut caches, &mut next, steps)?;
    Ok((side.since(&mark), ttft))
}

/// A text of well over `n` tokens for any tokenizer (the embedder cuts it to `n`), distinct
/// per `i` so no cache or batching shortcut applies.
fn long_text(i: usize, n: usize) -> String {
    let mut t = format!("Record {i}: ");
    for k in 0..n {
        t.push_str(&format!(
            "the patient cohort {} showed outcome {} after treatment {}; ",
            i + k,
            (i * 31 + k) % 97,
            k % 13
        ));
    }
    t
}

/// `--model PATH`: the model as `gelo embed` / `gelo generate` load it, twice (plain and
/// masked executors on engines of the same kind).
fn real_model(a: &ModelArgs, path: &std::path::Path) -> Result<()> {
    let files = models::ModelFiles::inspect(path, None)?;
    let (plain, masked) = sides(a)?;
    let name = path.file_name().map_or_else(|| "model".into(), |f| f.to_string_lossy().into_owned());
    match files.kind {
        models::Kind::Bert { .. } => {
            println!("{}", pass_header(a));
            println!("|---|---|---|---|---|{SHARE_RULE}");
            for &n in &a.n {
                let opts = models::LoadOptions { max_seq_length: Some(n), ..Default::default() };
                let ep = models::load_embedder(path, plain.exec.clone(), &opts)?;
                let em = models::load_embedder(path, masked.exec.clone(), &opts)?;
                for &b in &a.batch {
                    let texts: Vec<String> = (0..b).map(|i| long_text(i, n)).collect();
                    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                    let run = |e: &dyn models::Embedder, side: &Side| -> Result<Sample> {
                        let mark = side.mark();
                        e.embed(&refs)?;
                        Ok(side.since(&mark))
                    };
                    cells(a, &masked, &name, b, n, || run(ep.as_ref(), &plain), || run(em.as_ref(), &masked))?;
                }
            }
        }
        models::Kind::Decoder(_) => {
            let opts = models::LoadOptions::default();
            let mut gp = models::load_generator(path, plain.exec.clone(), &opts)?;
            let mut gm = models::load_generator(path, masked.exec.clone(), &opts)?;
            decode_table(a, &name, &mut gp.decoder, &mut gm.decoder, &plain, &masked)?;
        }
    }
    Ok(())
}

fn decode_table(
    a: &ModelArgs,
    name: &str,
    dp: &mut models::decoder::Decoder,
    dm: &mut models::decoder::Decoder,
    plain: &Side,
    masked: &Side,
) -> Result<()> {
    let vocab = dp.cfg.vocab_size;
    let (bl, pl) = labels(a);
    println!(
        "| model | batch | groups | prompt | {bl} tok/s | {pl} tok/s | {pl}/{bl} time | {bl} TTFT s | {pl} TTFT s | {}",
        share_header(a)
    );
    println!("|---|---|---|---|---|---|---|---|---|{SHARE_RULE}");
    let cells = a.batch.iter().flat_map(|&b| {
        // Groups split only batched steps: B = 1 runs once.
        let groups: Vec<usize> = if b > 1 { a.decode_groups.clone() } else { vec![1] };
        groups.into_iter().map(move |g| (b, g))
    });
    for (b, g) in cells {
        dp.set_decode_groups(g);
        dm.set_decode_groups(g);
        let (dp, dm) = (&*dp, &*dm);
        // One untimed pass of each side first (allocations, thread pools, caches).
        decode(dp, plain, b, a.prompt, 2, vocab)?;
        decode(dm, masked, b, a.prompt, 2, vocab)?;
        let (mut sp, mut sm, mut ttp, mut ttm) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.reps {
            let (s, t) = decode(dp, plain, b, a.prompt, a.steps, vocab)?;
            sp.push(s);
            ttp.push(t);
            let (s, t) = decode(dm, masked, b, a.prompt, a.steps, vocab)?;
            sm.push(s);
            ttm.push(t);
        }
        let (tp, tm) = (median(sp.iter().map(|s| s.secs).collect()), median(sm.iter().map(|s| s.secs).collect()));
        let toks = (b * a.steps) as f64;
        for (side, v) in [(bl, &sp), (pl, &sm)] {
            if let Some(line) = call_breakdown(v, a.steps) {
                eprintln!("{name} B = {b}, {g} group(s) {side}: {line}");
            }
        }
        println!(
            "| {name} | {b} | {g} | {} | {:.1} | {:.1} | {:.2} | {:.3} | {:.3} | {} |",
            a.prompt,
            toks / tp,
            toks / tm,
            tm / tp,
            median(ttp),
            median(ttm),
            shares(&sp, &sm)
        );
        lpn_counts(masked, &format!("{name} B = {b}"));
    }
    Ok(())
}

/// `steps` batched greedy decode steps of the sequences in `caches`, fed `next` (one token
/// each) and left holding the tokens the last step chose.
pub(crate) fn greedy_steps(
    d: &models::decoder::Decoder,
    caches: &mut [models::decoder::KvCache],
    next: &mut Vec<u32>,
    steps: usize,
) -> Result<()> {
    for _ in 0..steps {
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let feed: Vec<[u32; 1]> = next.iter().map(|&x| [x]).collect();
        let slices: Vec<&[u32]> = feed.iter().map(|f| f.as_slice()).collect();
        let logits = d.step(&mut refs, &slices)?;
        *next = (0..caches.len()).map(|r| argmax(logits.row(r))).collect();
    }
    Ok(())
}
