//! Attention products that have no public weight: `Q·Kᵀ`, softmax, `·V`.
//!
//! By default they run in the TEE ([`attend_plain`]): at the lengths where GELO is used the
//! linears dominate. Two executor-level levers move them to the engine above a length:
//!
//! * [`out_attn_mult`] (TwinShield §V-A): the engine multiplies a row-permuted, scaled,
//!   additively blinded `(2n×d)·(d×2n)` product; the TEE keeps the permutations, the four
//!   scalars and the blinding matrices and recombines the four partitions into `Q·Kᵀ`.
//! * [`permuted_attention`] (Amulet): softmax is equivariant under a row permutation, so
//!   the engine computes `softmax(πQM·(πKM)ᵀ)·πVN = π·softmax(QKᵀ)·V·N` on permuted,
//!   rotated operands, and the TEE undoes `π` and `N`. The engine does see the permuted
//!   score matrix; `docs/PROTOCOL.md` says what that leaks. Causal attention is kept in the
//!   TEE, because a permuted causal mask would reveal `π`.

use tensor::{Matrix, cpu};

use crate::{Engine, Masked};
use rand::{Rng, RngExt, seq::SliceRandom};
use rand_distr::{Distribution, StandardNormal};

use crate::{error::Result, mask::haar};

/// One attention head's operands.
pub struct Head<'a> {
    pub q: &'a Matrix,
    pub k: &'a Matrix,
    pub v: &'a Matrix,
}

/// Causal masking: query `i` sees keys `0..=i + offset` (offset = cached positions).
pub type Causal = Option<usize>;

/// `softmax(scale·Q·Kᵀ + causal)·V`, in the TEE.
pub fn attend_plain(head: &Head<'_>, scale: f32, causal: Causal) -> Matrix {
    attend_head(head, scale, causal, true)
}

/// [`attend_plain`], its products splitting over the compute pool only if `may_fork` (not
/// when the heads themselves already run in parallel).
fn attend_head(head: &Head<'_>, scale: f32, causal: Causal, may_fork: bool) -> Matrix {
    if head.q.rows() <= FEW_QUERIES {
        return attend_few(head, scale, causal);
    }
    let mut scores = cpu::matmul_on(head.q, head.k, true, may_fork);
    softmax_masked(&mut scores, scale, causal);
    cpu::matmul_on(&scores, head.v, false, may_fork)
}

/// Query rows up to which [`attend_few`] beats two GEMM calls: a decode step's head is one
/// query row against the cache, where a GEMM library's packing and dispatch cost more than
/// the products (Qwen3-1.7B: 896 such heads a step at B = 1, 7,168 at B = 8).
const FEW_QUERIES: usize = 4;

/// [`attend_plain`] by SIMD dot products and row updates, over visible keys only.
fn attend_few(head: &Head<'_>, scale: f32, causal: Causal) -> Matrix {
    let (k, v) = (head.k, head.v);
    let mut out = Matrix::zeros(head.q.rows(), v.cols());
    let mut scores = vec![0.0f32; k.rows()];
    for i in 0..head.q.rows() {
        let visible = causal.map_or(k.rows(), |off| (i + off + 1).min(k.rows()));
        let q = head.q.row(i);
        let row = &mut scores[..visible];
        for (j, s) in row.iter_mut().enumerate() {
            *s = tensor::simd::dot(q, k.row(j));
        }
        cpu::softmax_in_place(row, scale);
        let o = out.row_mut(i);
        for (j, &p) in row.iter().enumerate() {
            tensor::simd::axpy(p, v.row(j), o);
        }
    }
    out
}

/// [`attend_plain`] for every head, the heads in parallel on the compute pool: a head's own
/// products are too small to keep many cores busy (BERT-base: 12 heads of 256×64 per
/// sequence), a batch's heads together are not.
pub fn attend_all(heads: &[Head<'_>], scale: f32, causal: Causal) -> Vec<Matrix> {
    let flops: usize = heads.iter().map(|h| 2 * h.q.rows() * h.k.rows() * (h.q.cols() + h.v.cols())).sum();
    on_heads(heads.len(), flops, &|i| attend_head(&heads[i], scale, causal, false))
}

/// `head(i)` for `i < n`, in order: the heads in parallel on the compute pool (where the
/// products run, so no second pool contends with its polling workers) when `flops` is
/// worth a region, each head's own products then on its thread alone.
fn on_heads(n: usize, flops: usize, head: &(dyn Fn(usize) -> Matrix + Sync)) -> Vec<Matrix> {
    if !tensor::pool::worth(flops) {
        return (0..n).map(head).collect();
    }
    tensor::pool::global().map(n, head)
}

/// [`attend_all`] for several sequences at once (`seqs[i]`: one sequence's heads and its
/// causal offset), answered per sequence in order. At batched decode each sequence's heads
/// are too little work to fork for; all of a step's heads together are not.
pub fn attend_sequences(seqs: &[(&[Head<'_>], Causal)], scale: f32) -> Vec<Vec<Matrix>> {
    let flat: Vec<(&Head<'_>, Causal)> =
        seqs.iter().flat_map(|(heads, c)| heads.iter().map(move |h| (h, *c))).collect();
    let flops: usize = flat.iter().map(|(h, _)| 2 * h.q.rows() * h.k.rows() * (h.q.cols() + h.v.cols())).sum();
    let mut outs = on_heads(flat.len(), flops, &|i| attend_head(flat[i].0, scale, flat[i].1, false));
    let mut grouped = Vec::with_capacity(seqs.len());
    for (heads, _) in seqs.iter().rev() {
        grouped.push(outs.split_off(outs.len() - heads.len()));
    }
    grouped.reverse();
    grouped
}

/// Row softmax of `scale·scores`, with keys beyond each query's causal horizon excluded.
pub fn softmax_masked(scores: &mut Matrix, scale: f32, causal: Causal) {
    let cols = scores.cols();
    for (i, row) in scores.as_mut_slice().chunks_exact_mut(cols).enumerate() {
        let visible = causal.map_or(cols, |off| (i + off + 1).min(cols));
        cpu::softmax_in_place(&mut row[..visible], scale);
        row[visible..].iter_mut().for_each(|v| *v = 0.0);
    }
}

fn gaussian_like(rows: usize, cols: usize, rms: f32, rng: &mut impl Rng) -> Matrix {
    Matrix::from_fn(rows, cols, |_, _| {
        let g: f32 = StandardNormal.sample(rng);
        g * rms
    })
}

fn rms(m: &Matrix) -> f32 {
    ((m.frobenius() * m.frobenius()) / m.as_slice().len().max(1) as f64).sqrt().max(1e-6) as f32
}

fn random_scalar(rng: &mut impl Rng) -> f32 {
    let m: f32 = rng.random_range(0.5..2.0);
    if rng.random::<bool>() { m } else { -m }
}

/// Rows of `m` in the order `perm` (row `i` of the result is row `perm[i]` of `m`).
fn permute_rows(m: &Matrix, perm: &[usize]) -> Matrix {
    let mut out = Matrix::zeros(m.rows(), m.cols());
    for (i, &p) in perm.iter().enumerate() {
        out.row_mut(i).copy_from_slice(m.row(p));
    }
    out
}

/// `Q·Kᵀ` computed by the engine under TwinShield's four-partition blinding.
pub fn out_attn_mult(engine: &dyn Engine, q: &Matrix, k: &Matrix, rng: &mut impl Rng) -> Result<Matrix> {
    let (nq, nk) = (q.rows(), k.rows());
    // 1. Blinding matrices at the operands' own scale, and four secret scalars.
    let mut rq = gaussian_like(nq, q.cols(), rms(q), rng);
    let mut rk = gaussian_like(nk, k.cols(), rms(k), rng);
    let (a, b, c, d) = (random_scalar(rng), random_scalar(rng), random_scalar(rng), random_scalar(rng));
    let stack = |m: &Matrix, r: &Matrix, s1: f32, s2: f32| {
        let mut top = m.clone();
        top.as_mut_slice().iter_mut().zip(r.as_slice()).for_each(|(x, &y)| *x = s1 * (*x + y));
        let mut bottom = r.clone();
        bottom.as_mut_slice().iter_mut().for_each(|x| *x *= s2);
        Matrix::vstack([&top, &bottom]).expect("same width")
    };
    // 2. X = π_X·[a(Q+R_Q); b·R_Q], Y = π_Y·[c(K+R_K); d·R_K].
    let mut px: Vec<usize> = (0..2 * nq).collect();
    let mut py: Vec<usize> = (0..2 * nk).collect();
    px.shuffle(rng);
    py.shuffle(rng);
    let x = permute_rows(&stack(q, &rq, a, b), &px);
    let y = permute_rows(&stack(k, &rk, c, d), &py);
    // 3. The engine multiplies X·Yᵀ.
    let p = engine.matmul_dynamic(&Masked::mixed(x), &Masked::mixed(y), true)?;
    // 4. Undo the permutations and recombine the partitions:
    //    QKᵀ = B₁₁/(ac) − B₁₂/(ad) − B₂₁/(bc) + B₂₂/(bd).
    let mut inv_x = vec![0; 2 * nq];
    let mut inv_y = vec![0; 2 * nk];
    px.iter().enumerate().for_each(|(i, &p)| inv_x[p] = i);
    py.iter().enumerate().for_each(|(i, &p)| inv_y[p] = i);
    let coef = [[1.0 / (a * c), -1.0 / (a * d)], [-1.0 / (b * c), 1.0 / (b * d)]];
    let mut out = Matrix::zeros(nq, nk);
    for i in 0..nq {
        for j in 0..nk {
            let mut acc = 0.0f64;
            for (bi, row) in [i, nq + i].into_iter().enumerate() {
                for (bj, col) in [j, nk + j].into_iter().enumerate() {
                    acc += coef[bi][bj] as f64 * p.get(inv_x[row], inv_y[col]) as f64;
                }
            }
            out.set(i, j, acc as f32);
        }
    }
    rq.scrub();
    rk.scrub();
    Ok(out)
}

/// Bidirectional attention for several heads of one sequence, computed by the engine on
/// permuted and rotated operands. All heads share the key length.
pub fn permuted_attention(
    engine: &dyn Engine,
    heads: &[Head<'_>],
    scale: f32,
    rng: &mut impl Rng,
) -> Result<Vec<Matrix>> {
    if heads.is_empty() {
        return Ok(Vec::new());
    }
    let (nq, nk) = (heads[0].q.rows(), heads[0].k.rows());
    // 1. Fresh permutations of queries and keys, fresh rotations of the head dimensions.
    let mut pq: Vec<usize> = (0..nq).collect();
    let mut pk: Vec<usize> = (0..nk).collect();
    pq.shuffle(rng);
    pk.shuffle(rng);
    let mut qs = Vec::with_capacity(heads.len());
    let mut ks = Vec::with_capacity(heads.len());
    let mut vs = Vec::with_capacity(heads.len());
    let mut ns = Vec::with_capacity(heads.len());
    for h in heads {
        let m = haar::sample(h.q.cols(), rng);
        let n = haar::sample(h.v.cols(), rng);
        qs.push(Masked::mixed(cpu::matmul(&permute_rows(h.q, &pq), &m, false)));
        ks.push(Masked::mixed(cpu::matmul(&permute_rows(h.k, &pk), &m, false)));
        vs.push(Masked::mixed(cpu::matmul(&permute_rows(h.v, &pk), &n, false)));
        ns.push(n);
    }
    // 2. Engine: scores, one stacked softmax, then ·V.
    let pairs: Vec<(&Masked, &Masked)> = qs.iter().zip(&ks).collect();
    let scores = engine.matmul_dynamic_batched(&pairs, true)?;
    let stacked = Matrix::vstack(scores.iter()).expect("same key length");
    let probs = engine.softmax_rows(&Masked::mixed(stacked), scale)?;
    let probs: Vec<Masked> = (0..heads.len()).map(|h| Masked::mixed(probs.slice_rows(h * nq, (h + 1) * nq))).collect();
    let pairs: Vec<(&Masked, &Masked)> = probs.iter().zip(&vs).collect();
    let outs = engine.matmul_dynamic_batched(&pairs, false)?;
    // 3. TEE: O = π_qᵀ·(π_q·O·N)·Nᵀ.
    let mut inv = vec![0; nq];
    pq.iter().enumerate().for_each(|(i, &p)| inv[p] = i);
    Ok(outs
        .into_iter()
        .zip(ns.iter_mut())
        .map(|(o, n)| {
            let o = cpu::matmul(&o, n, true);
            n.scrub();
            permute_rows(&o, &inv)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `softmax(scale·q·Kᵀ)·V` row by row in f64, straight from the definition.
    fn reference(h: &Head<'_>, scale: f32, causal: Causal) -> Matrix {
        Matrix::from_fn(h.q.rows(), h.v.cols(), |i, c| {
            let visible = causal.map_or(h.k.rows(), |off| (i + off + 1).min(h.k.rows()));
            let s: Vec<f64> = (0..visible)
                .map(|j| {
                    scale as f64 * h.q.row(i).iter().zip(h.k.row(j)).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.iter().enumerate().map(|(j, p)| p / sum * h.v.get(j, c) as f64).sum::<f64>() as f32
        })
    }

    /// The few-query path (decode) and the GEMM path agree with the definition, causal at
    /// several cache offsets or not, at widths that are not a multiple of the SIMD lane.
    #[test]
    fn few_query_and_gemm_paths_match_the_definition() {
        let f = |r: usize, c: usize, s: usize| ((r * 7 + c * 3 + s) % 11) as f32 / 5.0 - 1.0;
        for (nq, nk, dh) in [(1, 1, 7), (1, 13, 7), (3, 13, 9), (4, 4, 16), (5, 13, 7), (9, 20, 33)] {
            let q = Matrix::from_fn(nq, dh, |r, c| f(r, c, 1));
            let k = Matrix::from_fn(nk, dh, |r, c| f(r, c, 2));
            let v = Matrix::from_fn(nk, dh + 1, |r, c| f(r, c, 3));
            let head = Head { q: &q, k: &k, v: &v };
            for causal in [None, Some(nk - nq.min(nk)), Some(0)] {
                let got = attend_plain(&head, 0.4, causal);
                let err = got.rel_err(&reference(&head, 0.4, causal));
                assert!(err < 1e-5, "nq={nq} nk={nk} dh={dh} causal={causal:?}: {err:e}");
            }
        }
    }
}
