//! f32 weights packed once, when they are provisioned, into panels of [`NR`] outputs, and
//! the AVX-512 product on them.
//!
//! A weight is public and multiplied thousands of times; a GEMM library packs its operand
//! again at every call, once per task when the rows are split over the pool (BERT-base's FFN
//! weight is 9.4 MB, packed by each of 32 tasks of every call). Here the weight is laid out
//! as the kernel reads it when it is loaded: panel `p` holds, for each input `k`, the 32
//! values `W[p·32 + j][k]` side by side (two 64-byte vectors), the last panel padded with
//! zeros. A task packs its block of activation rows once (`k`-major tiles of [`MR`] rows, so
//! the kernel reads one stream instead of `MR`) and multiplies it with each of its panels:
//! `MR × 32` accumulators in registers, two vector loads and `MR` broadcasts for `2·MR`
//! fused multiply-adds per input.
//!
//! Products are split over the compute pool by blocks of rows (as many as keep a block's
//! packed rows in L2) and groups of panels, so a decode step's one row still spreads over
//! every thread. Sums run over `k` in order, one lane per output: the result is the plain
//! dot product's, up to the order of f32 additions.

use std::{cell::RefCell, sync::OnceLock};

use crate::{Matrix, WeightLayout, pool};

/// Outputs per panel: two AVX-512 vectors.
pub const NR: usize = 32;

/// Activation rows per kernel call.
const MR: usize = 12;

/// Bytes of packed activation rows a task keeps (about half an L2 of the server cores this
/// runs on, beside the panel it streams).
const BLOCK_BYTES: usize = 256 * 1024;

/// Whether the panel kernels are used: only where `GELO_F32_PANELS=1` asks for them and the
/// CPU runs AVX-512 F. Off by default: on the 2-vCPU development VM (2026-12-07) a whole
/// MiniLM pass ran at 0.89x the GEMM library's (58-60 against 64-68 texts/s), although
/// 8-row products ran 1.7x; the many-core effect (no task repacking the weight) is still
/// to be measured. Read once.
pub fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let cpu = std::is_x86_feature_detected!("avx512f");
        #[cfg(not(target_arch = "x86_64"))]
        let cpu = false;
        cpu && std::env::var("GELO_F32_PANELS").is_ok_and(|v| v == "1")
    })
}

/// An f32 weight of `d_out` outputs × `d_in` inputs in panels; see the module documentation.
pub struct PanelWeight {
    d_in: usize,
    d_out: usize,
    /// `⌈d_out/32⌉` panels of `d_in × 32` values.
    data: Vec<f32>,
}

impl std::fmt::Debug for PanelWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PanelWeight({}x{})", self.d_in, self.d_out)
    }
}

impl PanelWeight {
    /// Packs `w` (`d_in × d_out` values in `layout`), the panels in parallel.
    pub fn pack(w: &[f32], d_in: usize, d_out: usize, layout: WeightLayout) -> Self {
        assert_eq!(w.len(), d_in * d_out, "weight size");
        let panels = d_out.div_ceil(NR);
        let mut data = vec![0.0f32; panels * d_in * NR];
        pool::global().for_chunks_mut(&mut data, d_in * NR, 1, &|p0, chunk| {
            for (dp, panel) in chunk.chunks_exact_mut(d_in * NR).enumerate() {
                let o0 = (p0 + dp) * NR;
                for j in 0..NR.min(d_out - o0) {
                    let o = o0 + j;
                    for k in 0..d_in {
                        panel[k * NR + j] = match layout {
                            WeightLayout::OutIn => w[o * d_in + k],
                            WeightLayout::InOut => w[k * d_out + o],
                        };
                    }
                }
            }
        });
        PanelWeight { d_in, d_out, data }
    }

    pub fn d_in(&self) -> usize {
        self.d_in
    }

    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// `x · W` (`x.rows() × d_out`).
    ///
    /// # Panics
    /// If `x` is not `d_in` wide, or this CPU does not run AVX-512 F.
    pub fn product(&self, x: &Matrix) -> Matrix {
        assert_eq!(x.cols(), self.d_in, "product input width");
        #[cfg(target_arch = "x86_64")]
        assert!(std::is_x86_feature_detected!("avx512f"), "the f32 panel kernels need AVX-512");
        #[cfg(not(target_arch = "x86_64"))]
        panic!("the f32 panel kernels need AVX-512");
        let (m, n, k) = (x.rows(), self.d_out, self.d_in);
        if m == 0 {
            return Matrix::zeros(0, n);
        }
        let panels = n.div_ceil(NR);
        let threads = pool::global().threads();
        // Rows a block: as many whole kernel tiles as fit the packed-rows budget.
        let block = (BLOCK_BYTES / (4 * k)).max(1).div_ceil(MR) * MR;
        let row_blocks = m.div_ceil(block);
        let want = if 2 * m * n * k >= super::PAR_MIN_FLOPS { threads * 3 } else { 1 };
        let groups = want.div_ceil(row_blocks).clamp(1, panels);
        let per_group = panels.div_ceil(groups);
        let groups = panels.div_ceil(per_group);
        let mut c: Vec<f32> = Vec::with_capacity(m * n);
        let cp = pool::SyncPtr(c.as_mut_ptr());
        let task = |t: usize| {
            let (rb, g) = (t / groups, t % groups);
            let rows = rb * block..((rb + 1) * block).min(m);
            let panels = g * per_group..((g + 1) * per_group).min(panels);
            // SAFETY: tasks own disjoint (row block, panel group) blocks of `c`, which has
            // room for `m × n` values; AVX-512 F was checked above.
            unsafe { self.block_product(x, rows, panels, cp) };
        };
        if row_blocks * groups == 1 {
            task(0);
        } else {
            pool::global().run(row_blocks * groups, &task);
        }
        // SAFETY: the tasks cover every row block and panel group, so every one of the
        // `m × n` outputs was written.
        unsafe { c.set_len(m * n) };
        Matrix::from_vec(m, n, c).expect("m × n values")
    }

    /// Rows `rows` of `x` against panels `panels`, into `c` (`x.rows() × d_out`).
    ///
    /// # Safety
    /// The CPU runs AVX-512 F; `c` has room for `x.rows() × d_out` values and no one else
    /// touches these rows' columns of these panels.
    unsafe fn block_product(
        &self,
        x: &Matrix,
        rows: std::ops::Range<usize>,
        panels: std::ops::Range<usize>,
        c: pool::SyncPtr<f32>,
    ) {
        thread_local! {
            static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
        }
        let (k, n) = (self.d_in, self.d_out);
        let tiles = rows.len().div_ceil(MR);
        PACKED.with_borrow_mut(|a| {
            // Tile `t` holds rows `rows.start + t·MR ..` as `[k][MR]`, missing rows zero.
            a.clear();
            a.resize(tiles * k * MR, 0.0);
            for (i, r) in rows.clone().enumerate() {
                let (t, lane) = (i / MR, i % MR);
                let tile = &mut a[t * k * MR..(t + 1) * k * MR];
                for (kk, &v) in x.row(r).iter().enumerate() {
                    tile[kk * MR + lane] = v;
                }
            }
            for p in panels {
                let b = &self.data[p * k * NR..(p + 1) * k * NR];
                let cols = NR.min(n - p * NR);
                for t in 0..tiles {
                    let r0 = rows.start + t * MR;
                    let live = MR.min(rows.end - r0);
                    // SAFETY: the tile and the panel are `k` inputs long; `c`'s rows
                    // `r0..r0 + live`, columns `p·32..p·32 + cols` are this task's.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        avx512::tile(
                            &a[t * k * MR..(t + 1) * k * MR],
                            b,
                            k,
                            c.get().add(r0 * n + p * NR),
                            n,
                            live,
                            cols,
                        )
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let _ = (live, cols, b, r0);
                }
            }
        });
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// `c[r·ldc + j] = Σ_k a[k·MR + r]·b[k·NR + j]` for `r < live`, `j < cols`.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F; `a` and `b` hold `k` inputs of their layouts; `c` is valid
    /// for `live` (1 to [`MR`]) rows of `cols` values `ldc` apart.
    pub(super) unsafe fn tile(a: &[f32], b: &[f32], k: usize, c: *mut f32, ldc: usize, live: usize, cols: usize) {
        // One kernel per row count, so a short tile (a decode step's row) costs its own
        // rows' arithmetic, not twelve.
        macro_rules! by_rows {
            ($($r:literal)*) => {
                match live {
                    $($r => unsafe { rows::<$r>(a, b, k, c, ldc, cols) },)*
                    _ => unreachable!("a tile holds 1 to {MR} rows"),
                }
            };
        }
        by_rows!(1 2 3 4 5 6 7 8 9 10 11 12)
    }

    /// [`tile`] for `R` live rows.
    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const R: usize>(a: &[f32], b: &[f32], k: usize, c: *mut f32, ldc: usize, cols: usize) {
        debug_assert!(a.len() >= k * MR && b.len() >= k * NR && R <= MR && cols <= NR);
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for kk in 0..k {
            // SAFETY: `kk < k`, inside both operands (asserted by the caller).
            unsafe {
                let b0 = _mm512_loadu_ps(bp.add(kk * NR));
                let b1 = _mm512_loadu_ps(bp.add(kk * NR + 16));
                let at = ap.add(kk * MR);
                for r in 0..R {
                    let av = _mm512_set1_ps(*at.add(r));
                    lo[r] = _mm512_fmadd_ps(av, b0, lo[r]);
                    hi[r] = _mm512_fmadd_ps(av, b1, hi[r]);
                }
            }
        }
        let m0: __mmask16 = if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 };
        let m1: __mmask16 = if cols >= NR {
            0xFFFF
        } else if cols <= 16 {
            0
        } else {
            (1u16 << (cols - 16)) - 1
        };
        for r in 0..R {
            // SAFETY: row `r < R` of `c`, its first `cols` values (the masks).
            unsafe {
                _mm512_mask_storeu_ps(c.add(r * ldc), m0, lo[r]);
                _mm512_mask_storeu_ps(c.add(r * ldc + 16), m1, hi[r]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn panels_compute_the_product_of_either_layout() {
        #[cfg(target_arch = "x86_64")]
        if !std::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512 here: the panel kernels cannot run on this CPU");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (m, k, n) in [(1, 7, 3), (13, 64, 33), (12, 384, 96), (25, 1000, 70), (700, 96, 130), (3, 3072, 64)] {
            let x = Matrix::from_fn(m, k, |_, _| rng.random_range(-1.0f32..1.0));
            let w: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            for layout in [WeightLayout::OutIn, WeightLayout::InOut] {
                let got = PanelWeight::pack(&w, k, n, layout).product(&x);
                assert_eq!(got.shape(), (m, n));
                for j in 0..m {
                    for o in 0..n {
                        let want: f64 = (0..k)
                            .map(|i| {
                                let wv = match layout {
                                    WeightLayout::OutIn => w[o * k + i],
                                    WeightLayout::InOut => w[i * n + o],
                                };
                                x.get(j, i) as f64 * wv as f64
                            })
                            .sum();
                        let err = (got.get(j, o) as f64 - want).abs();
                        assert!(
                            err <= 1e-5 * (k as f64).sqrt() + 1e-6,
                            "{m}x{k}x{n} {layout:?} [{j},{o}]: {} vs {want}",
                            got.get(j, o)
                        );
                    }
                }
            }
        }
    }
}
