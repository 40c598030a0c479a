//! The dual-LPN executor: every linear offloaded to the engine as an int8 product over
//! `Z_{2^32}`, its input hidden by a pseudorandom mask under the dual LPN assumption.
//!
//! For an input width `d` the executor holds a public code `H` (`N = 4·d` rows of `d`
//! uniform `u32`) and, per weight, the table `H·W_q` (`N × d_out`), computed by the engine
//! and checked by the TEE with Freivalds when the weight is provisioned. A linear's input
//! row `x` is quantized to int8 (one scale per row), masked as `x_q + e·H mod 2^32` with a
//! fresh `e` of exactly `t` nonzero entries (positions uniform without replacement, values
//! uniform in `Z_{2^32}∖{0}`), and sent; the engine returns `(x_q + e·H)·W_q mod 2^32`,
//! and the TEE subtracts `e·(H·W_q)`: the sum of `t` table rows. The result is exactly
//! `x_q·W_q`, the quantized plaintext product ([`tensor::ring::RingWeight::reference`]),
//! bit for bit.
//!
//! What it rests on (`docs/SECURITY.md`, "Computational hiding"): the masks are
//! pseudorandom if dual LPN over `Z_{2^32}` with code length `N`, dimension `N − d` and
//! noise weight `t` is hard; `t` is the smallest `attack/estimators` gives 148 bits for
//! (128 after a 2^20-row margin, hence a fresh code every 2^20 masked rows). What it does
//! not hide: the positions of `e` select the table rows the TEE reads, so a hypervisor that
//! traces the TEE's page accesses learns them, and with them the row (see the attack gated
//! in `attack/run.sh`). It is therefore a named option, never the default.
//!
//! Integrity: `k` secret probe vectors `v` over `Z_{2^32}` per weight, `W_q·v` precomputed;
//! a returned row `y'` must satisfy `y'·v = (x_q + r)·(W_q·v)`, and every unmasked entry
//! must lie within `±d·127²`. An error whose entries all have 2-adic valuation at least
//! `v₀ = ⌈log₂(2·d·127² + 1)⌉` fails the range check; any other passes a probe with
//! probability at most `2^{−(33 − v₀)}`, so a tampered row passes with probability at most
//! `2^{−k·(33 − v₀)}` ([`DualLpnConfig::miss_bound`]).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use rand::{Rng, RngExt, seq::index};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use tensor::{
    Matrix, Weight, WeightId, pool,
    ring::{self, Q_MAX, RingWeight},
};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::{
    Executor, IntegrityStatus, Pass, Scheme, attend_in_tee, attend_sequences_in_tee, check_blocks, check_input,
};
use crate::{
    Engine, RingMasked,
    attention::{Causal, Head},
    error::{ProtocolError, Result},
    os_seeded_rng,
    verify::IntegrityViolation,
};

/// Code length over input width: `N = CODE_FACTOR · d`.
pub const CODE_FACTOR: usize = 4;

/// The smallest input width the parameters were estimated for.
pub const MIN_WIDTH: usize = 256;

/// Noise weight `t` for input width `d` at `N = 4·d`: each at least 148 bits against the
/// cheapest attack in `python3 attack/estimators params` (Stern–Dumer), 128 after the
/// 2^20-row margin. `None` outside the estimated widths.
pub fn noise_weight(d: usize) -> Option<usize> {
    match d {
        MIN_WIDTH..=1536 => Some(134),
        1537..=3072 => Some(132),
        3073..=6144 => Some(130),
        6145..=12_288 => Some(126),
        _ => None,
    }
}

/// Settings of the dual-LPN scheme, recorded in the attested scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DualLpnConfig {
    /// Freivalds probes per weight; 0 turns the integrity check off.
    pub probes: usize,
    /// Masked rows under one set of codes before they are redrawn (and every table
    /// recomputed).
    pub rows_per_code: u64,
}

impl Default for DualLpnConfig {
    fn default() -> Self {
        DualLpnConfig { probes: 4, rows_per_code: 1 << 20 }
    }
}

impl DualLpnConfig {
    /// Upper bound on the probability that a tampered product row of a weight with input
    /// width `d` passes the check.
    pub fn miss_bound(&self, d: usize) -> f64 {
        let v0 = (2.0 * d as f64 * (Q_MAX * Q_MAX) as f64 + 1.0).log2().ceil();
        2f64.powf(-(self.probes as f64) * (33.0 - v0).max(0.0))
    }
}

/// What the scheme did so far: the quantities `docs/SECURITY.md` predicts, measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DualLpnCounts {
    /// Input rows masked (one per row of a linear call, however many weights share it).
    pub rows: u64,
    /// 32-bit multiply-adds of masking (`t·d` a row) and unmasking (`t·d_out` a row and weight).
    pub mask_macs: u64,
    pub unmask_macs: u64,
    /// Bytes of `H` and of the tables read at secret positions.
    pub table_bytes: u64,
    /// 32-bit multiply-adds of the Freivalds checks of products.
    pub verify_macs: u64,
    /// Multiply-adds the engine did on products (`d·d_out` a row and weight).
    pub engine_macs: u64,
    /// Codes drawn (every one recomputes the tables of its width).
    pub codes_drawn: u64,
}

#[derive(Default)]
struct Counters {
    rows: AtomicU64,
    mask_macs: AtomicU64,
    unmask_macs: AtomicU64,
    table_bytes: AtomicU64,
    verify_macs: AtomicU64,
    engine_macs: AtomicU64,
    codes_drawn: AtomicU64,
}

/// A public code: `n` rows of `d` uniform words, row-major.
struct Code {
    n: usize,
    t: usize,
    h: Vec<u32>,
}

/// One provisioned weight, as the TEE keeps it; the secret probes are wiped on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
struct Entry {
    #[zeroize(skip)]
    ring: Arc<RingWeight>,
    /// `H·W_q` for the current code of `d_in`, `n × d_out` (public).
    #[zeroize(skip)]
    table: Vec<u32>,
    /// Secret probe vectors `v` (`k × d_out`) and `W_q·v` (`k × d_in`).
    probes: Vec<u32>,
    wv: Vec<u32>,
}

#[derive(Default)]
struct State {
    codes: HashMap<usize, Code>,
    weights: HashMap<WeightId, Entry>,
    /// Bumped at every redraw of the codes.
    generation: u64,
}

/// The sparse secret `e` of one row: positions and values.
#[derive(Zeroize, ZeroizeOnDrop)]
struct Noise {
    pos: Vec<u32>,
    val: Vec<u32>,
}

impl Noise {
    fn draw(rng: &mut impl Rng, n: usize, t: usize) -> Self {
        let mut pos: Vec<u32> = index::sample(rng, n, t).into_iter().map(|p| p as u32).collect();
        // Reading the rows in ascending order leaks nothing the set does not.
        pos.sort_unstable();
        let val = (0..t)
            .map(|_| {
                loop {
                    let v: u32 = rng.random();
                    if v != 0 {
                        break v;
                    }
                }
            })
            .collect();
        Noise { pos, val }
    }

    /// `acc += e·T` (or `acc −= e·T` when `subtract`) for the `width`-wide rows of `table`.
    fn add_rows(&self, table: &[u32], width: usize, acc: &mut [u32], subtract: bool) {
        for (&p, &e) in self.pos.iter().zip(&self.val) {
            let e = if subtract { e.wrapping_neg() } else { e };
            ring::axpy(acc, e, &table[p as usize * width..(p as usize + 1) * width]);
        }
    }
}

/// Offloads every linear as a dual-LPN-masked ring product; attention stays in the TEE.
pub struct DualLpnExecutor {
    engine: Arc<dyn Engine>,
    cfg: DualLpnConfig,
    state: RwLock<State>,
    /// Rows masked under the current codes.
    used: AtomicU64,
    rng: Mutex<ChaCha20Rng>,
    counts: Counters,
    checked: AtomicU64,
    failures: AtomicU64,
    last: Mutex<String>,
}

impl DualLpnExecutor {
    pub fn new(engine: Arc<dyn Engine>, cfg: DualLpnConfig) -> Result<Self> {
        if cfg.rows_per_code == 0 {
            return Err(ProtocolError::Config("dual-lpn: rows_per_code must be positive".into()));
        }
        Ok(DualLpnExecutor {
            engine,
            cfg,
            state: RwLock::default(),
            used: AtomicU64::new(0),
            rng: Mutex::new(os_seeded_rng()),
            counts: Counters::default(),
            checked: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            last: Mutex::new(String::new()),
        })
    }

    pub fn counts(&self) -> DualLpnCounts {
        let c = &self.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DualLpnCounts {
            rows: get(&c.rows),
            mask_macs: get(&c.mask_macs),
            unmask_macs: get(&c.unmask_macs),
            table_bytes: get(&c.table_bytes),
            verify_macs: get(&c.verify_macs),
            engine_macs: get(&c.engine_macs),
            codes_drawn: get(&c.codes_drawn),
        }
    }

    /// Bytes the TEE holds for the scheme: codes, tables and probes.
    pub fn table_bytes_held(&self) -> usize {
        let st = self.state.read().expect("poisoned");
        let codes: usize = st.codes.values().map(|c| c.h.len()).sum();
        let tables: usize = st.weights.values().map(|e| e.table.len() + e.probes.len() + e.wv.len()).sum();
        (codes + tables) * 4
    }

    fn draw_code(&self, d: usize) -> Result<Code> {
        let t = noise_weight(d).ok_or_else(|| {
            ProtocolError::Config(format!("dual-lpn: no parameters for input width {d} (estimated for 256..=12288)"))
        })?;
        let n = CODE_FACTOR * d;
        let mut rng = self.rng.lock().expect("poisoned");
        let h = (0..n * d).map(|_| rng.random()).collect();
        self.counts.codes_drawn.fetch_add(1, Ordering::Relaxed);
        Ok(Code { n, t, h })
    }

    /// `H·W_q` from the engine, checked with the weight's probes before it is trusted.
    fn table(&self, id: &WeightId, code: &Code, ring: &RingWeight, probes: &[u32], wv: &[u32]) -> Result<Vec<u32>> {
        let d = ring.d_in;
        let operand = RingMasked::new(code.n, d, code.h.clone());
        let table = self.engine.ring_matmul_many(&operand, std::slice::from_ref(id))?.pop().unwrap_or_default();
        check_len("table", table.len(), code.n * ring.d_out)?;
        let k = probes.len() / ring.d_out.max(1);
        for row in 0..code.n {
            let y = &table[row * ring.d_out..(row + 1) * ring.d_out];
            let x = &code.h[row * d..(row + 1) * d];
            if let Some((probe, residual)) = failed_probe(x, y, probes, wv, k) {
                return Err(self.poison(violation(id, row, probe, residual, 0.0)));
            }
        }
        Ok(table)
    }

    /// Counts `rows` masked rows, redrawing every code (and table) once the current ones
    /// have masked `rows_per_code`.
    fn account(&self, rows: u64) -> Result<()> {
        if rows > self.cfg.rows_per_code {
            return Err(ProtocolError::Config(format!(
                "dual-lpn: one product of {rows} rows exceeds rows_per_code {}",
                self.cfg.rows_per_code
            )));
        }
        loop {
            let generation = self.state.read().expect("poisoned").generation;
            if self.used.fetch_add(rows, Ordering::SeqCst) + rows <= self.cfg.rows_per_code {
                return Ok(());
            }
            let mut st = self.state.write().expect("poisoned");
            if st.generation == generation {
                self.redraw(&mut st)?;
                self.used.store(0, Ordering::SeqCst);
            }
        }
    }

    fn redraw(&self, st: &mut State) -> Result<()> {
        let widths: Vec<usize> = st.codes.keys().copied().collect();
        for d in widths {
            let code = self.draw_code(d)?;
            // Every table of this width is computed and checked before any replaces its old
            // one: a failure leaves the width on its old code and tables, never a mix.
            let fresh = st
                .weights
                .iter()
                .filter(|(_, e)| e.ring.d_in == d)
                .map(|(id, e)| Ok((id.clone(), self.table(id, &code, &e.ring, &e.probes, &e.wv)?)))
                .collect::<Result<Vec<_>>>()?;
            for (id, table) in fresh {
                st.weights.get_mut(&id).expect("listed above").table = table;
            }
            st.codes.insert(d, code);
        }
        st.generation += 1;
        tracing::info!(target: "gelo::protocol", generation = st.generation, "dual-lpn codes redrawn");
        Ok(())
    }

    fn poison(&self, v: IntegrityViolation) -> ProtocolError {
        self.failures.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().expect("poisoned") = v.to_string();
        tracing::error!(target: "gelo::integrity", weight = %v.weight, "engine returned a wrong ring product");
        ProtocolError::Integrity(v)
    }
}

fn check_len(op: &'static str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(ProtocolError::Shape { op, detail: format!("engine returned {got} words, expected {want}") });
    }
    Ok(())
}

/// The first probe `j` with `y·v_j ≠ x·(W·v_j) mod 2^32`, if any, and the difference
/// (as a signed word).
fn failed_probe(x: &[u32], y: &[u32], probes: &[u32], wv: &[u32], k: usize) -> Option<(usize, f64)> {
    let (d, m) = (x.len(), y.len());
    (0..k).find_map(|j| {
        let lhs = dot(y, &probes[j * m..(j + 1) * m]);
        let rhs = dot(x, &wv[j * d..(j + 1) * d]);
        (lhs != rhs).then(|| (j, f64::from(lhs.wrapping_sub(rhs) as i32)))
    })
}

fn violation(id: &WeightId, row: usize, probe: usize, residual: f64, tolerance: f64) -> IntegrityViolation {
    IntegrityViolation { weight: id.to_string(), row, probe, residual, tolerance }
}

fn dot(a: &[u32], b: &[u32]) -> u32 {
    a.iter().zip(b).fold(0u32, |s, (&x, &y)| s.wrapping_add(x.wrapping_mul(y)))
}

impl Executor for DualLpnExecutor {
    fn provision(&self, id: WeightId, weight: Weight) -> Result<()> {
        weight.check(&id).map_err(crate::EngineError::from)?;
        let ring = Arc::new(RingWeight::quantize(&weight).map_err(crate::EngineError::from)?);
        drop(weight);
        let (d, m, k) = (ring.d_in, ring.d_out, self.cfg.probes);
        let mut st = self.state.write().expect("poisoned");
        if st.weights.contains_key(&id) {
            return Err(ProtocolError::DuplicateWeight(id));
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = st.codes.entry(d) {
            slot.insert(self.draw_code(d)?);
        }
        let probes: Vec<u32> = {
            let mut rng = self.rng.lock().expect("poisoned");
            (0..k * m).map(|_| rng.random()).collect()
        };
        let wv = ring.times_vectors(&probes, k);
        self.engine.register_ring(id.clone(), ring.clone())?;
        let table = match self.table(&id, &st.codes[&d], &ring, &probes, &wv) {
            Ok(t) => t,
            Err(e) => {
                let _ = self.engine.unregister(&id);
                return Err(e);
            }
        };
        st.weights.insert(id, Entry { ring, table, probes, wv });
        Ok(())
    }

    fn begin(&self, blocks: &[usize]) -> Result<Box<dyn Pass + '_>> {
        check_blocks(blocks)?;
        Ok(Box::new(LpnPass { exec: self, blocks: blocks.to_vec() }))
    }

    fn scheme(&self) -> Scheme {
        Scheme { executor: "dual-lpn".into(), masked: None, lpn: Some(self.cfg), engine: self.engine.info() }
    }

    fn integrity(&self) -> IntegrityStatus {
        let checked = self.checked.load(Ordering::SeqCst);
        let failures = self.failures.load(Ordering::SeqCst);
        if failures == 0 {
            IntegrityStatus::Clean { checked }
        } else {
            IntegrityStatus::Compromised { checked, failures, last: self.last.lock().expect("poisoned").clone() }
        }
    }
}

struct LpnPass<'a> {
    exec: &'a DualLpnExecutor,
    blocks: Vec<usize>,
}

impl Pass for LpnPass<'_> {
    fn blocks(&self) -> &[usize] {
        &self.blocks
    }

    fn linear_many(&mut self, h: &Matrix, ids: &[WeightId]) -> Result<Vec<Matrix>> {
        let exec = self.exec;
        let rows = h.rows();
        exec.account(rows as u64)?;
        let st = exec.state.read().expect("poisoned");
        let entries = ids
            .iter()
            .map(|id| st.weights.get(id).ok_or_else(|| ProtocolError::UnknownWeight(id.clone())))
            .collect::<Result<Vec<_>>>()?;
        check_input("linear", h, &self.blocks, entries.iter().map(|e| e.ring.d_in))?;
        let d = h.cols();
        let code = &st.codes[&d];
        let (mut xq, sx) = ring::quantize_rows(h);
        let noise: Vec<Noise> = {
            let mut rng = exec.rng.lock().expect("poisoned");
            (0..rows).map(|_| Noise::draw(&mut *rng, code.n, code.t)).collect()
        };
        let mut masked: Vec<u32> = xq.iter().map(|&v| v as i32 as u32).collect();
        xq.zeroize();
        pool::global().for_chunks_mut(&mut masked, d, 1, &|r0, chunk| {
            for (k, row) in chunk.chunks_mut(d).enumerate() {
                noise[r0 + k].add_rows(&code.h, d, row, false);
            }
        });
        let operand = RingMasked::new(rows, d, masked);
        let products = exec.engine.ring_matmul_many(&operand, ids)?;
        check_len("ring_matmul", products.len(), ids.len())?;
        let mut outs = Vec::with_capacity(ids.len());
        for ((id, e), y) in ids.iter().zip(&entries).zip(products) {
            outs.push(unmask(exec, id, e, &operand, y, &noise, &sx)?);
        }
        let (t, rows_u) = (code.t as u64, rows as u64);
        let c = &exec.counts;
        let m_sum: u64 = entries.iter().map(|e| e.ring.d_out as u64).sum();
        c.rows.fetch_add(rows_u, Ordering::Relaxed);
        c.mask_macs.fetch_add(rows_u * t * d as u64, Ordering::Relaxed);
        c.unmask_macs.fetch_add(rows_u * t * m_sum, Ordering::Relaxed);
        c.table_bytes.fetch_add(rows_u * t * (d as u64 + m_sum) * 4, Ordering::Relaxed);
        c.verify_macs
            .fetch_add(rows_u * exec.cfg.probes as u64 * (d as u64 * ids.len() as u64 + m_sum), Ordering::Relaxed);
        c.engine_macs.fetch_add(rows_u * d as u64 * m_sum, Ordering::Relaxed);
        Ok(outs)
    }

    fn attend(&mut self, heads: &[Head<'_>], scale: f32, causal: Causal) -> Result<Vec<Matrix>> {
        attend_in_tee(heads, scale, causal)
    }

    fn attend_sequences(&mut self, seqs: &[(&[Head<'_>], Causal)], scale: f32) -> Result<Vec<Vec<Matrix>>> {
        attend_sequences_in_tee(seqs, scale)
    }

    fn end(self: Box<Self>) {}
}

/// Checks the engine's rows of one weight, removes the masks' share and scales back.
fn unmask(
    exec: &DualLpnExecutor,
    id: &WeightId,
    e: &Entry,
    operand: &RingMasked,
    mut y: Vec<u32>,
    noise: &[Noise],
    sx: &[f32],
) -> Result<Matrix> {
    let (d, m, rows) = (e.ring.d_in, e.ring.d_out, operand.rows());
    check_len("ring_matmul", y.len(), rows * m)?;
    let k = exec.cfg.probes;
    let bound = (d as i64) * i64::from(Q_MAX * Q_MAX);
    let x = operand.as_slice();
    let verdicts = pool::global()
        .map(rows, &|r| failed_probe(&x[r * d..(r + 1) * d], &y[r * m..(r + 1) * m], &e.probes, &e.wv, k));
    if k > 0 {
        exec.checked.fetch_add(rows as u64, Ordering::Relaxed);
    }
    if let Some((row, (probe, residual))) = verdicts.iter().enumerate().find_map(|(r, v)| v.map(|p| (r, p))) {
        return Err(exec.poison(violation(id, row, probe, residual, 0.0)));
    }
    let mut out = Matrix::zeros(rows, m);
    pool::global().for_chunks_mut(&mut y, m, 1, &|r0, chunk| {
        for (k, row) in chunk.chunks_mut(m).enumerate() {
            noise[r0 + k].add_rows(&e.table, m, row, true);
        }
    });
    for r in 0..rows {
        for o in 0..m {
            let acc = y[r * m + o];
            if i64::from(acc as i32).abs() > bound {
                y.zeroize();
                return Err(exec.poison(violation(id, r, k, f64::from(acc as i32), bound as f64)));
            }
            out.set(r, o, ring::dequantize_one(acc, sx[r], e.ring.scales()[o]));
        }
    }
    y.zeroize();
    Ok(out)
}

#[cfg(test)]
mod tests;
