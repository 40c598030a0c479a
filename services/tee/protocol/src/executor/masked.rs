//! The masked (GELO) executor and its settings: every linear's input reaches the engine
//! only as `U = A·[H; S]`, a fresh secret orthogonal mask `A` over the activations `H` and
//! high-energy shield rows `S`; the products are checked (U-Verify, when on), unmasked and
//! stripped of the shield rows inside the TEE.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, OnceLock, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tensor::{Matrix, MatrixView, Precision, Weight, WeightId, WeightLayout};

use super::{Dims, Executor, IntegrityStatus, Pass, Scheme, check_blocks, check_heads, check_input};
use crate::{
    Engine, Masked,
    attention::{self, Causal, Head},
    error::{ProtocolError, Result},
    mask::{
        self, BlockMask, CostModel, Family, MaskKind,
        small::{self, Lead, SmallBlock},
    },
    os_seeded_rng, shield,
    shield::ShieldConfig,
    verify::{Probes, UVerifyConfig},
};

/// Where attention products run, by sequence length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AttentionConfig {
    /// Compute `Q·Kᵀ` on the engine with OutAttnMult once the key length reaches this.
    pub out_attn_mult_min_len: Option<usize>,
    /// Run bidirectional attention on the engine, permuted, once the length reaches this.
    pub permuted_min_len: Option<usize>,
}

/// How a decode step's sequences (one new row each) are masked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecodeMasks {
    /// Every sequence its own block: one row under `k` shield rows (`B·(1 + k)` rows reach
    /// the engine at batch `B`).
    #[default]
    PerSequence,
    /// One block for the whole step: the `B` rows mixed with each other under one mask and
    /// `k` shield rows (`B + k` rows). Passes with a sequence of more than one row
    /// (prefill, embedding) keep per-sequence blocks.
    Shared,
}

impl DecodeMasks {
    fn is_per_sequence(&self) -> bool {
        *self == DecodeMasks::PerSequence
    }

    /// Rows under each mask of a pass over sequences of `blocks` rows: `blocks` itself, or
    /// one block of all rows for a shared decode step (several sequences, one row each).
    pub fn mask_blocks(self, blocks: &[usize]) -> Vec<usize> {
        if self == DecodeMasks::Shared && blocks.len() > 1 && blocks.iter().all(|&n| n == 1) {
            vec![blocks.len()]
        } else {
            blocks.to_vec()
        }
    }
}

impl std::str::FromStr for DecodeMasks {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "per-sequence" => Ok(DecodeMasks::PerSequence),
            "shared" => Ok(DecodeMasks::Shared),
            other => Err(format!("unknown decode mask topology `{other}` (per-sequence, shared)")),
        }
    }
}

/// Settings of a masked executor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaskedConfig {
    pub mask: MaskKind,
    pub shield: ShieldConfig,
    pub verify: Option<UVerifyConfig>,
    pub attention: AttentionConfig,
    /// Absent from the scheme (and its identity) while per-sequence, as before the option.
    #[serde(default, skip_serializing_if = "DecodeMasks::is_per_sequence")]
    pub decode_masks: DecodeMasks,
}

impl Default for MaskedConfig {
    fn default() -> Self {
        MaskedConfig {
            mask: MaskKind::Auto,
            shield: ShieldConfig::default(),
            verify: None,
            attention: AttentionConfig::default(),
            decode_masks: DecodeMasks::PerSequence,
        }
    }
}

struct Provisioned {
    dims: Dims,
    storage: Precision,
    /// Kept only while U-Verify is on, to redraw probes after a failure.
    weight: Option<Weight>,
    probes: RwLock<Option<Probes>>,
}

#[derive(Default)]
struct Integrity {
    checked: AtomicU64,
    failures: AtomicU64,
    last: Mutex<String>,
}

/// The GELO executor: every linear's input reaches the engine only as `U = A·[H; S]`.
pub struct MaskedExecutor {
    engine: Arc<dyn Engine>,
    cfg: MaskedConfig,
    weights: RwLock<HashMap<WeightId, Arc<Provisioned>>>,
    integrity: Integrity,
    /// Engine throughput (flop/s) for the Auto cost model, measured on first use.
    engine_rate: OnceLock<f64>,
    times: TeeTimes,
    /// Shield Gaussians drawn ahead, one spare per sequence, handed from pass to pass so a
    /// step's first linear finds its draws done too (see [`shield::Spare`]).
    spares: Mutex<Vec<shield::Spare>>,
    /// Input widths of the linears seen so far, for which small blocks prepare their
    /// shield products ahead (see [`SmallBlock`]).
    widths: Mutex<Vec<usize>>,
}

/// Input widths a pass prepares shield products for (a model has a handful).
const MAX_WIDTHS: usize = 8;

/// Cumulative TEE time of a masked executor's protocol work, for benchmarks: where a masked
/// pass's time goes beside the engine calls and the model's own (shared) work.
#[derive(Default)]
struct TeeTimes {
    mask_ns: AtomicU64,
    recover_ns: AtomicU64,
}

/// Seconds a masked executor has spent since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProtocolSeconds {
    /// Drawing shield rows and applying masks to linear inputs.
    pub mask: f64,
    /// Checking (U-Verify) and unmasking the engine's products, stripping shield rows.
    pub recover: f64,
}

impl MaskedExecutor {
    pub fn new(engine: Arc<dyn Engine>, cfg: MaskedConfig) -> Result<Self> {
        if cfg.mask == MaskKind::Hd3 && cfg.shield.rows == 0 && cfg.shield.energy != 0.0 {
            return Err(ProtocolError::Config("shield energy without shield rows".into()));
        }
        if let Some(v) = cfg.verify
            && (v.probes == 0 || v.range < 1)
        {
            return Err(ProtocolError::Config("U-Verify needs at least one probe and L ≥ 1".into()));
        }
        if !(cfg.shield.energy.is_finite() && cfg.shield.energy >= 0.0) {
            return Err(ProtocolError::Config("shield energy must be finite and non-negative".into()));
        }
        Ok(MaskedExecutor {
            engine,
            cfg,
            weights: RwLock::default(),
            integrity: Integrity::default(),
            engine_rate: OnceLock::new(),
            times: TeeTimes::default(),
            spares: Mutex::default(),
            widths: Mutex::default(),
        })
    }

    pub fn config(&self) -> &MaskedConfig {
        &self.cfg
    }

    /// The mask family a sequence of `n` rows gets (`Auto` resolved by the cost model).
    pub fn family_for(&self, n: usize) -> Family {
        self.family(n)
    }

    /// Time spent so far in the protocol's own TEE work (masks and recovery).
    pub fn protocol_seconds(&self) -> ProtocolSeconds {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        ProtocolSeconds { mask: s(&self.times.mask_ns), recover: s(&self.times.recover_ns) }
    }

    fn get(&self, id: &WeightId) -> Result<Arc<Provisioned>> {
        self.weights.read().expect("poisoned").get(id).cloned().ok_or_else(|| ProtocolError::UnknownWeight(id.clone()))
    }

    /// Family for a block of `n` rows under `Auto`: the cheaper one by the cost model, for
    /// the mean shape of the provisioned weights.
    fn family(&self, n: usize) -> Family {
        match self.cfg.mask {
            MaskKind::Haar => Family::Haar,
            MaskKind::Hd3 => Family::Hd3,
            MaskKind::Hd3Blocked => Family::Hd3Blocked,
            MaskKind::Auto => {
                let (dims, count) = {
                    let w = self.weights.read().expect("poisoned");
                    let count = w.len().max(1);
                    let (a, b) = w.values().fold((0, 0), |(a, b), p| (a + p.dims.d_in, b + p.dims.d_out));
                    (((a / count).max(1), (b / count).max(1)), count)
                };
                let rate = *self.engine_rate.get_or_init(|| self.measure_engine());
                CostModel::measured().choose(n, self.cfg.shield.rows, dims, count, rate)
            }
        }
    }

    /// Times the engine on a throwaway random weight (flop/s).
    fn measure_engine(&self) -> f64 {
        let (d, n) = (512usize, 64usize);
        let id = WeightId::new("__gelo_calibration");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let w: Vec<f32> = (0..d * d).map(|_| rand::RngExt::random::<f32>(&mut rng) - 0.5).collect();
        if self.engine.register(id.clone(), Weight::f32(d, d, WeightLayout::InOut, w)).is_err() {
            return 1e11;
        }
        let x = || Masked::mixed(Matrix::from_fn(n, d, |r, c| ((r * 31 + c * 17) % 97) as f32 / 97.0));
        let _ = self.engine.matmul(&x(), &id);
        let t = Instant::now();
        let reps = 4;
        for _ in 0..reps {
            let _ = self.engine.matmul(&x(), &id);
        }
        let secs = t.elapsed().as_secs_f64().max(1e-9);
        let _ = self.engine.unregister(&id);
        (2 * n * d * d * reps) as f64 / secs
    }

    /// After a failed check: count it, and redraw every weight's probes so whatever the
    /// engine learned about the old ones is worthless.
    fn poison(&self, what: &str) {
        self.integrity.failures.fetch_add(1, Ordering::SeqCst);
        *self.integrity.last.lock().expect("poisoned") = what.to_string();
        tracing::error!(target: "gelo::integrity", reason = what, "engine returned a wrong product; probes redrawn, engine flagged");
        let Some(cfg) = self.cfg.verify else { return };
        let mut rng = os_seeded_rng();
        let operand = self.engine.info().operand_precision;
        for p in self.weights.read().expect("poisoned").values() {
            if let Some(w) = &p.weight {
                *p.probes.write().expect("poisoned") = Some(Probes::draw(&cfg, w, p.storage, operand, &mut rng));
            }
        }
    }
}

impl Executor for MaskedExecutor {
    fn provision(&self, id: WeightId, weight: Weight) -> Result<()> {
        if self.weights.read().expect("poisoned").contains_key(&id) {
            return Err(ProtocolError::DuplicateWeight(id));
        }
        let dims = Dims { d_in: weight.d_in, d_out: weight.d_out };
        let kept = self.cfg.verify.map(|_| weight.clone());
        let reg = self.engine.register(id.clone(), weight)?;
        let probes = match (&self.cfg.verify, &kept) {
            (Some(cfg), Some(w)) => {
                let operand = self.engine.info().operand_precision;
                Some(Probes::draw(cfg, w, reg.storage, operand, &mut os_seeded_rng()))
            }
            _ => None,
        };
        let p = Provisioned { dims, storage: reg.storage, weight: kept, probes: RwLock::new(probes) };
        self.weights.write().expect("poisoned").insert(id, Arc::new(p));
        Ok(())
    }

    fn begin(&self, blocks: &[usize]) -> Result<Box<dyn Pass + '_>> {
        check_blocks(blocks)?;
        let mut rng = os_seeded_rng();
        let k = self.cfg.shield.rows;
        let mask_blocks = self.cfg.decode_masks.mask_blocks(blocks);
        let masks: Vec<BlockMask> = mask_blocks
            .iter()
            .map(|&n| {
                let family = self.family(n);
                BlockMask::sample(family, mask::order(family, n, k), &mut rng)
            })
            .collect();
        let spares = {
            let mut kept = self.spares.lock().expect("poisoned");
            let from = kept.len().saturating_sub(mask_blocks.len());
            let mut spares = kept.split_off(from);
            spares.resize_with(mask_blocks.len(), shield::Spare::default);
            spares
        };
        let (leads, small) = masks.iter().zip(&mask_blocks).map(|(m, &n)| small::split(m, n).unzip()).unzip();
        let widths = self.widths.lock().expect("poisoned").clone();
        Ok(Box::new(MaskedPass {
            exec: self,
            blocks: blocks.to_vec(),
            mask_blocks,
            masks,
            leads,
            small,
            rng,
            spares,
            widths,
        }))
    }

    fn scheme(&self) -> Scheme {
        Scheme { executor: "masked".into(), masked: Some(self.cfg), lpn: None, engine: self.engine.info() }
    }

    fn integrity(&self) -> IntegrityStatus {
        let checked = self.integrity.checked.load(Ordering::SeqCst);
        let failures = self.integrity.failures.load(Ordering::SeqCst);
        if failures == 0 {
            IntegrityStatus::Clean { checked }
        } else {
            IntegrityStatus::Compromised {
                checked,
                failures,
                last: self.integrity.last.lock().expect("poisoned").clone(),
            }
        }
    }
}

struct MaskedPass<'a> {
    exec: &'a MaskedExecutor,
    /// Rows of each sequence.
    blocks: Vec<usize>,
    /// Rows under each mask: `blocks`, or one block of all rows for a shared decode step.
    mask_blocks: Vec<usize>,
    /// One per mask block.
    masks: Vec<BlockMask>,
    /// One per mask block of order up to [`mask::small::MAX_ORDER`] (a decode step's): its
    /// activation columns, and its shield columns with their prepared products.
    leads: Vec<Option<Lead>>,
    small: Vec<Option<SmallBlock>>,
    rng: ChaCha20Rng,
    /// One per mask block (used by the blocks without a [`SmallBlock`]).
    spares: Vec<shield::Spare>,
    /// Input widths to prepare small blocks' shield products for.
    widths: Vec<usize>,
}

/// Multiply–adds ×2 of recovering `d`-wide products of every block (`n_i` rows of `A_iᵀ·Z_i`).
fn recover_flops(masks: &[BlockMask], blocks: &[usize], d: usize) -> usize {
    masks.iter().zip(blocks).map(|(m, &n)| 2 * n * m.order() * d).sum()
}

/// Spares kept between passes (the most sequences of a batch one executor serves at once).
const MAX_SPARES: usize = 256;

/// The engine's products for `u` against `weights`: each of the expected shape, and, when
/// U-Verify is on, each passing its probes (a failure poisons the executor).
fn check_products(
    exec: &MaskedExecutor,
    u: &Masked,
    zs: &[MatrixView<'_>],
    weights: &[Arc<Provisioned>],
    ids: &[WeightId],
) -> Result<()> {
    if zs.len() != ids.len() {
        return Err(ProtocolError::Shape {
            op: "linear",
            detail: format!("engine returned {} products for {} weights", zs.len(), ids.len()),
        });
    }
    for ((z, w), id) in zs.iter().zip(weights).zip(ids) {
        if z.shape() != (u.rows(), w.dims.d_out) {
            return Err(ProtocolError::Shape {
                op: "linear",
                detail: format!("engine returned {:?} for `{id}`, expected {:?}", z.shape(), (u.rows(), w.dims.d_out)),
            });
        }
        // The probes' read guard must be released before `poison` redraws them.
        let verdict = w.probes.read().expect("poisoned").as_ref().map(|probes| {
            exec.integrity.checked.fetch_add(1, Ordering::Relaxed);
            probes.check(id.as_str(), u.matrix(), *z)
        });
        if let Some(Err(v)) = verdict {
            exec.poison(&v.to_string());
            return Err(ProtocolError::Integrity(v));
        }
    }
    Ok(())
}

/// First `n_i` rows of `A_iᵀ·Z_i` for every mask block (`n_i` rows under mask `A_i`):
/// `H·W` without the shield rows. `z` is what the engine returned (masked), read in place.
/// Blocks are recovered in parallel (a block's own column tiles are too few to keep many
/// cores busy: 12 at d = 768).
fn recover(masks: &[BlockMask], leads: &[Option<Lead>], mask_blocks: &[usize], z: MatrixView<'_>) -> Matrix {
    let d = z.cols();
    let rows: usize = mask_blocks.iter().sum();
    let mut out = Matrix::zeros(rows, d);
    let mut jobs = Vec::with_capacity(masks.len());
    let (mut z_rest, mut out_rest) = (z.as_slice(), out.as_mut_slice());
    for ((mask, lead), &n) in masks.iter().zip(leads).zip(mask_blocks) {
        let (zb, zr) = z_rest.split_at(mask.order() * d);
        let (ob, or) = std::mem::take(&mut out_rest).split_at_mut(n * d);
        jobs.push((mask, lead.as_ref(), zb, n, ob));
        z_rest = zr;
        out_rest = or;
    }
    let recover = |(mask, lead, zb, n, ob): (&BlockMask, Option<&Lead>, &[f32], usize, &mut [f32])| match lead {
        Some(lead) => lead.recover(zb, d, ob),
        None => mask.recover(zb, d, n, ob),
    };
    if tensor::cpu::worth_parallel(recover_flops(masks, mask_blocks, d)) {
        jobs.into_par_iter().for_each(recover);
    } else {
        jobs.into_iter().for_each(recover);
    }
    out
}

impl MaskedPass<'_> {
    /// `U = blockdiag(A_i)·[H_i; S_i]` for all mask blocks, stacked. Blocks are masked in
    /// parallel, each drawing its shield rows from its own ChaCha12 stream seeded from the
    /// pass's ChaCha20 (at batched decode the shield draws dominate the TEE's work).
    fn mask_input(&mut self, h: &Matrix) -> Matrix {
        let d = h.cols();
        let orders: Vec<usize> = self.masks.iter().map(BlockMask::order).collect();
        let total: usize = orders.iter().sum();
        // Every element of U is written below (A·[H; S] fills all `total` rows).
        let mut u = Matrix::from_vec(total, d, self.exec.engine.buffer(total * d)).expect("sized to its shape");
        let seeds: Vec<[u8; 32]> = self.masks.iter().map(|_| rand::RngExt::random(&mut self.rng)).collect();
        // Split the input and the operand into per-block row ranges.
        let mut parts = Vec::with_capacity(self.masks.len());
        let (mut h_rest, mut u_rest) = (h.as_slice(), u.as_mut_slice());
        for (&n, &s) in self.mask_blocks.iter().zip(&orders) {
            let (hb, hr) = h_rest.split_at(n * d);
            let (ub, ur) = std::mem::take(&mut u_rest).split_at_mut(s * d);
            parts.push((hb, ub));
            h_rest = hr;
            u_rest = ur;
        }
        let energy = self.exec.cfg.shield.energy;
        type Job<'j> =
            (((&'j BlockMask, (&'j Option<Lead>, &'j mut Option<SmallBlock>)), (&'j [f32], &'j mut [f32])), [u8; 32]);
        let work = |((((mask, (lead, small)), (hb, ub)), seed), spare): (Job<'_>, &mut shield::Spare)| {
            let mut rng = rand_chacha::ChaCha12Rng::from_seed(seed);
            match (lead, small) {
                (Some(lead), Some(small)) => small.apply(lead, hb, d, energy, &mut rng, ub),
                _ => {
                    let len = (mask.order() - hb.len() / d.max(1)) * d;
                    spare.lend(len, hb, d, energy, &mut rng, |g, factors| mask.apply_scaled(hb, g, factors, d, ub));
                }
            }
        };
        let jobs: Vec<_> = self
            .masks
            .iter()
            .zip(self.leads.iter().zip(self.small.iter_mut()))
            .zip(parts)
            .zip(seeds)
            .zip(self.spares.iter_mut())
            .collect();
        // A decode step's blocks (one row under k shield rows each) are cheaper than a fork.
        let flops: usize = orders.iter().map(|&s| 2 * s * s * d).sum();
        if jobs.len() > 1 && tensor::cpu::worth_parallel(flops) {
            jobs.into_par_iter().for_each(work);
        } else {
            jobs.into_iter().for_each(work);
        }
        u
    }

    /// Heads of one key length `len`, by the configured attention levers.
    fn attend_run(&mut self, heads: &[Head<'_>], len: usize, scale: f32, causal: Causal) -> Result<Vec<Matrix>> {
        let cfg = self.exec.cfg.attention;
        let engine = self.exec.engine.as_ref();
        if causal.is_none() && cfg.permuted_min_len.is_some_and(|m| len >= m) {
            return attention::permuted_attention(engine, heads, scale, &mut self.rng);
        }
        if cfg.out_attn_mult_min_len.is_some_and(|m| len >= m) {
            return heads
                .iter()
                .map(|h| {
                    let mut s = attention::out_attn_mult(engine, h.q, h.k, &mut self.rng)?;
                    attention::softmax_masked(&mut s, scale, causal);
                    Ok(tensor::cpu::matmul(&s, h.v, false))
                })
                .collect();
        }
        Ok(attention::attend_all(heads, scale, causal))
    }

    #[cfg(test)]
    pub(crate) fn dense_masks(&self) -> Vec<Matrix> {
        self.masks.iter().map(BlockMask::dense).collect()
    }
}

impl Pass for MaskedPass<'_> {
    fn blocks(&self) -> &[usize] {
        &self.blocks
    }

    fn linear_many(&mut self, h: &Matrix, ids: &[WeightId]) -> Result<Vec<Matrix>> {
        let weights = ids.iter().map(|id| self.exec.get(id)).collect::<Result<Vec<_>>>()?;
        check_input("linear", h, &self.blocks, weights.iter().map(|w| w.dims.d_in))?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // 1. Mask: the only thing that leaves the TEE is U.
        let t = Instant::now();
        let u = Masked::mixed(self.mask_input(h));
        self.exec.times.mask_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // 2. The engine multiplies U by each public weight; meanwhile idle cores draw the
        //    next linears' shield rows (small blocks: their products with the mask too).
        let d = h.cols();
        if !self.widths.contains(&d) && self.widths.len() < MAX_WIDTHS {
            self.widths.push(d);
        }
        let exec = self.exec;
        let seeds: Vec<[u8; 32]> = self.spares.iter().map(|_| rand::RngExt::random(&mut self.rng)).collect();
        let energy = exec.cfg.shield.energy;
        let (spares, small, widths) = (&mut self.spares, &mut self.small, &self.widths);
        let (masks, leads, mask_blocks) = (&self.masks, &self.leads, &self.mask_blocks);
        // 3. Check each product (when U-Verify is on), then unmask and strip shields (the
        //    products in parallel). A decode step's products are read where the engine
        //    lends them from (the Vulkan engine's mapped read-back: 14 → 1 µs a call at
        //    Qwen3-1.7B B = 1); embedding-sized ones are copied out first: recovered
        //    straight from the mapping, they made the next linear's masking slower
        //    (BERT-base 32 × 256 on the H200: mask share 11–12 % against 7–8 %).
        let lend = small.iter().all(Option::is_some);
        let mut unmasked = Err(ProtocolError::Shape { op: "linear", detail: "the engine lent no products".into() });
        let mut read = |zs: &[MatrixView<'_>]| {
            let t = Instant::now();
            unmasked = check_products(exec, &u, zs, &weights, ids).map(|()| {
                let flops: usize = zs.iter().map(|z| recover_flops(masks, mask_blocks, z.cols())).sum();
                let one = |z: &MatrixView<'_>| recover(masks, leads, mask_blocks, *z);
                if tensor::cpu::worth_parallel(flops) {
                    zs.par_iter().map(one).collect()
                } else {
                    zs.iter().map(one).collect()
                }
            });
            exec.times.recover_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        };
        // The engine call stays on this thread (`in_place_scope`, not `join`: from outside
        // the pool, `join` hands both halves to workers and sleeps until they finish, so the
        // operand and the products crossed cores and every call paid two thread wake-ups).
        // `leads` stays readable for the recovery while the draws renew `small`.
        rayon::in_place_scope(|scope| {
            scope.spawn(|_| {
                spares.par_iter_mut().zip(small.par_iter_mut()).zip(seeds).for_each(|((spare, small), seed)| {
                    let mut rng = rand_chacha::ChaCha12Rng::from_seed(seed);
                    match small {
                        Some(small) if energy != 0.0 => widths.iter().for_each(|&w| small.prepare(w, &mut rng)),
                        Some(_) => {}
                        None => spare.top_up(&mut rng),
                    }
                })
            });
            if lend {
                exec.engine.matmul_many_with(&u, ids, &mut read)
            } else {
                crate::engine::lend_returned(exec.engine.as_ref(), &u, ids, &mut read)
            }
        })?;
        // U is masked data: its buffer goes back to the pool.
        exec.engine.recycle(u.into_matrix().into_vec());
        unmasked
    }

    fn attend(&mut self, heads: &[Head<'_>], scale: f32, causal: Causal) -> Result<Vec<Matrix>> {
        check_heads(heads)?;
        let cfg = self.exec.cfg.attention;
        if cfg.permuted_min_len.is_none() && cfg.out_attn_mult_min_len.is_none() {
            return Ok(attention::attend_all(heads, scale, causal));
        }
        // The engine-side levers are chosen by key length: decide per run of heads of one
        // length (a batch's sequences may differ).
        let mut out = Vec::with_capacity(heads.len());
        let mut rest = heads;
        while let Some(first) = rest.first() {
            let len = first.k.rows();
            let run = rest.iter().take_while(|h| h.k.rows() == len).count();
            let (these, tail) = rest.split_at(run);
            out.extend(self.attend_run(these, len, scale, causal)?);
            rest = tail;
        }
        Ok(out)
    }

    fn attend_sequences(&mut self, seqs: &[(&[Head<'_>], Causal)], scale: f32) -> Result<Vec<Vec<Matrix>>> {
        let cfg = self.exec.cfg.attention;
        if cfg.permuted_min_len.is_some() || cfg.out_attn_mult_min_len.is_some() {
            return seqs.iter().map(|(heads, causal)| self.attend(heads, scale, *causal)).collect();
        }
        seqs.iter().try_for_each(|(heads, _)| check_heads(heads))?;
        Ok(attention::attend_sequences(seqs, scale))
    }

    fn end(self: Box<Self>) {}
}

impl Drop for MaskedPass<'_> {
    fn drop(&mut self) {
        // BlockMask's own Drop scrubs dense masks and HD₃ signs; reseed the pass RNG so its
        // state (which determined the masks) does not linger either.
        self.masks.clear();
        self.leads.clear();
        self.small.clear();
        self.rng = ChaCha20Rng::from_seed([0; 32]);
        {
            let mut widths = self.exec.widths.lock().expect("poisoned");
            for &w in &self.widths {
                if !widths.contains(&w) && widths.len() < MAX_WIDTHS {
                    widths.push(w);
                }
            }
        }
        let mut kept = self.exec.spares.lock().expect("poisoned");
        let room = MAX_SPARES.saturating_sub(kept.len());
        kept.extend(self.spares.drain(..).take(room));
    }
}

#[cfg(test)]
mod tests;
