//! Weights kept in their checkpoint's block format, and the int8 products on them.
//!
//! A GGUF file's quantized tensors stay in memory as their blocks (4.5 to 8.5 bits a
//! weight): decode reads every weight once per token, so the bytes read are the speed.
//! Products quantize the activations per block to int8 ([`QuantRows`], as llama.cpp's
//! `Q8_0`/`Q8_K`) and multiply in integers: `maddubs`/`madd` on AVX2, with the block scales
//! applied once per block in f32. The kernel set is picked at run time from the CPU
//! ([`Isa`]); the portable kernels define the integer sums every path computes and are
//! checked, like every SIMD path, against the f32 product of the dequantized operands.

mod act;
mod format;
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
#[cfg(target_arch = "x86_64")]
mod packed_vnni;
mod portable;
#[cfg(target_arch = "x86_64")]
mod stream_avx2;
#[cfg(target_arch = "x86_64")]
mod stream_avx512;
#[cfg(test)]
mod tests;

use std::{
    cell::RefCell,
    ops::Range,
    sync::{Arc, OnceLock},
};

pub use act::{ActKind, QuantRows};
pub use format::{QK_K, QuantFormat};

use crate::{Matrix, WeightError, pool};

/// A kernel set, chosen at run time from the CPU's features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Scalar integer kernels: any CPU.
    Portable,
    /// AVX2 + FMA + F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F/BW with VNNI, and AVX2: the packed products in 512-bit `vpdpbusd`, the
    /// streaming ones as on AVX2.
    Avx512Vnni,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// Every kernel set this CPU can run, the portable one first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            v.push(Isa::Avx2);
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vnni")
            {
                v.push(Isa::Avx512Vnni);
            }
        }
        v
    }

    /// The best kernel set this CPU runs, or the one `GELO_ISA` names if the CPU runs it
    /// (for measuring one path against another on the same machine). Read once.
    pub fn detected() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let available = Isa::available();
            let best = *available.last().expect("portable is always available");
            match std::env::var("GELO_ISA") {
                Ok(name) => available.into_iter().find(|i| i.name() == name).unwrap_or(best),
                Err(_) => best,
            }
        })
    }
}

/// Activation rows from which products unpack weight tiles into panels ([`packed`]) instead
/// of streaming the weight's blocks once per group of four rows.
pub const PACKED_MIN_ROWS: usize = 16;

/// [`PACKED_MIN_ROWS`], or the count `GELO_PACKED_MIN_ROWS` names (for measuring the two
/// paths against each other on one machine). Read once.
pub fn packed_min_rows() -> usize {
    static ROWS: OnceLock<usize> = OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("GELO_PACKED_MIN_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&r| r >= 1)
            .unwrap_or(PACKED_MIN_ROWS)
    })
}

/// The fewest activation rows a packed task multiplies with its tile.
const PACKED_MIN_CHUNK: usize = 16;

/// How the streaming kernels of `format` want their activations: as ggml's vector dot
/// products of that format do.
fn stream_kind(format: QuantFormat) -> ActKind {
    match format {
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => ActKind::Q8_1,
        f if f.block_elements() == QK_K => ActKind::Q8K,
        _ => ActKind::Q8_0,
    }
}

/// How the packed kernels of `format` want their activations: the streaming kernels'
/// quantization, with K-quant scales and sums per group of the weight's scales.
fn packed_kind(format: QuantFormat) -> ActKind {
    match stream_kind(format) {
        ActKind::Q8K => ActKind::Q8KGroups(portable::group(format)),
        other => other,
    }
}

/// A weight of `rows` outputs × `cols` inputs held as its checkpoint's blocks, one output
/// per row of blocks (PyTorch's `[out, in]`, GGUF's storage order). Products are `x·Wᵀ`.
#[derive(Clone)]
pub struct QuantMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    bytes: Arc<[u8]>,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantMatrix({} {}x{})", self.format, self.rows, self.cols)
    }
}

impl QuantMatrix {
    /// Checks that `bytes` holds `rows` rows of `cols` values in whole blocks of `format`.
    pub fn new(format: QuantFormat, rows: usize, cols: usize, bytes: Arc<[u8]>) -> Result<Self, WeightError> {
        let (n, size) = format.geometry();
        if rows == 0 || cols == 0 || !cols.is_multiple_of(n) {
            return Err(WeightError::Shape(format!(
                "{format} holds rows of whole {n}-value blocks, not {rows}x{cols}"
            )));
        }
        if bytes.len() != rows * cols / n * size {
            return Err(WeightError::Shape(format!(
                "{format} {rows}x{cols} is {} bytes, got {}",
                rows * cols / n * size,
                bytes.len()
            )));
        }
        if !format.has_kernels() {
            return Err(WeightError::Shape(format!("{format} has no product kernels; dequantize it")));
        }
        Ok(QuantMatrix { format, rows, cols, bytes })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.format.block_elements() * self.format.block_bytes()
    }

    /// The stored blocks.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Row `r` dequantized into `out` (`cols` values): an embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        self.format.dequantize(&self.bytes[r * rb..(r + 1) * rb], &mut out[..self.cols]);
    }

    /// Every value, row-major (`rows × cols`), exactly as ggml dequantizes it.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        let ptr = pool::SyncPtr(out.as_mut_ptr());
        pool::global().for_ranges(self.rows, 64, &|r| {
            for i in r {
                // SAFETY: each task writes its own rows of `out`.
                let row = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(i * self.cols), self.cols) };
                self.dequantize_row(i, row);
            }
        });
        out
    }

    /// The rows `picks`, in that order, as a new weight (a head over some tokens).
    pub fn select_rows(&self, picks: &[usize]) -> Result<Self, WeightError> {
        let rb = self.row_bytes();
        let mut bytes = Vec::with_capacity(picks.len() * rb);
        for &r in picks {
            if r >= self.rows {
                return Err(WeightError::Shape(format!("row {r} of a {}-row weight", self.rows)));
            }
            bytes.extend_from_slice(&self.bytes[r * rb..(r + 1) * rb]);
        }
        QuantMatrix::new(self.format, picks.len(), self.cols, bytes.into())
    }

    /// `x · Wᵀ` (`x.rows() × rows`) with the CPU's best kernels.
    pub fn product(&self, x: &Matrix) -> Matrix {
        self.product_on(x, Isa::detected())
    }

    /// `x · Wᵀ` with the kernel set `isa` (which this CPU must run: see [`Isa::available`]).
    pub fn product_on(&self, x: &Matrix, isa: Isa) -> Matrix {
        products_on(&[self], x, isa).pop().expect("one weight, one product")
    }

    /// The packed task: tile `t` of `spec.nr` weight rows unpacked into this thread's panel,
    /// against activation rows `rows`.
    fn packed_task(&self, xq: &QuantRows, isa: Isa, t: usize, rows: Range<usize>, out: *mut f32) {
        thread_local! {
            static PANEL: RefCell<packed::Panel> = RefCell::default();
        }
        let spec = panel_spec(self.format, isa);
        let g = portable::group(self.format);
        let o0 = t * spec.nr;
        let cols = spec.nr.min(self.rows - o0);
        let ldo = self.rows;
        PANEL.with_borrow_mut(|panel| {
            packed::pack(self, o0, spec, isa, panel);
            match isa {
                Isa::Portable => packed::tile_portable(panel, spec, g, xq, rows.start, rows.len(), out, ldo, o0, cols),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Avx2` is only chosen where the CPU runs it; the panel was packed
                // for it from a weight as wide as `xq`, quantized in groups of `g`; the caller
                // owns columns `o0..o0 + cols` of rows `rows`.
                Isa::Avx2 => unsafe { packed_avx2::tile_rows(panel, spec.signed, g, xq, rows, out, ldo, o0, cols) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as for `Avx2`, with the VNNI panel.
                Isa::Avx512Vnni => unsafe { packed_vnni::tile_rows(panel, g, xq, rows, out, ldo, o0, cols) },
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("x86 kernels on another architecture"),
            }
        });
    }

    /// The streaming task: weight rows `range` against every activation row.
    fn stream_task(&self, xq: &QuantRows, isa: Isa, range: Range<usize>, out: *mut f32) {
        let rb = self.row_bytes();
        let ldo = self.rows;
        match isa {
            Isa::Portable => {
                for o in range {
                    let w = &self.bytes[o * rb..(o + 1) * rb];
                    for j in 0..xq.rows() {
                        // SAFETY: the caller owns columns `range` of `out`.
                        unsafe { *out.add(j * ldo + o) = portable::dot(self.format, w, xq.row(j), xq.kind) };
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` (and `Avx512Vnni`, a superset) is only chosen where the CPU runs
            // it; the rows and blocks were checked at construction and quantization; the
            // caller owns columns `range`.
            Isa::Avx2 | Isa::Avx512Vnni => unsafe {
                stream_avx2::rows(isa == Isa::Avx512Vnni, self.format, &self.bytes, rb, range, xq, out, ldo)
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("x86 kernels on another architecture"),
        }
    }
}

/// `x · Wᵀ` for every weight of `ws` (all as wide as `x`) with the CPU's best kernels: the
/// activations are quantized once per kind the weights need, and every weight's work goes
/// into one parallel region (a decode step's Q/K/V, or gate and up, are one region, not
/// three or two).
pub fn products(ws: &[&QuantMatrix], x: &Matrix) -> Vec<Matrix> {
    products_on(ws, x, Isa::detected())
}

/// One piece of a [`products_on`] region.
enum Task {
    /// Weight `w`'s rows `rows`, streamed against every activation row.
    Stream { w: usize, rows: Range<usize> },
    /// Weight `w`'s tile `tile` against activation rows `rows`.
    Packed { w: usize, tile: usize, rows: Range<usize> },
}

/// [`products`] with the kernel set `isa`.
pub fn products_on(ws: &[&QuantMatrix], x: &Matrix, isa: Isa) -> Vec<Matrix> {
    let m = x.rows();
    for w in ws {
        assert_eq!(x.cols(), w.cols, "product input width");
    }
    if m == 0 || ws.is_empty() {
        return ws.iter().map(|w| Matrix::zeros(m, w.rows)).collect();
    }
    let packed = m >= packed_min_rows();
    let kind = |w: &QuantMatrix| if packed { packed_kind(w.format) } else { stream_kind(w.format) };
    let mut quantized: Vec<QuantRows> = Vec::new();
    for w in ws {
        if !quantized.iter().any(|q| q.kind == kind(w)) {
            quantized.push(QuantRows::new(x.as_slice(), m, x.cols(), kind(w)));
        }
    }
    let xq = |w: &QuantMatrix| quantized.iter().find(|q| q.kind == kind(w)).expect("quantized above");
    let threads = pool::global().threads();
    let mut tasks = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        if packed {
            let tiles = w.rows.div_ceil(panel_spec(w.format, isa).nr);
            // Split the rows only as far as the pool needs tasks: every task unpacks its tile.
            let chunks = (threads * 4).div_ceil(tiles).clamp(1, m.div_ceil(PACKED_MIN_CHUNK));
            let chunk = m.div_ceil(chunks);
            for tile in 0..tiles {
                for c in 0..chunks {
                    tasks.push(Task::Packed { w: i, tile, rows: c * chunk..((c + 1) * chunk).min(m) });
                }
            }
        } else {
            // About 16 KB of weights a piece (enough to hide the claim), and no more pieces
            // than the pool needs to balance.
            let min_rows = (16384 / w.row_bytes()).max(1).max(w.rows.div_ceil(threads * 4));
            let pieces = w.rows.div_ceil(min_rows);
            for p in 0..pieces {
                tasks.push(Task::Stream { w: i, rows: p * min_rows..((p + 1) * min_rows).min(w.rows) });
            }
        }
    }
    // The tasks cover every row and column of every output between them, so the outputs
    // are not zeroed first: a prefill's outputs are 40 MB a layer, which one thread would
    // clear while the others wait.
    let mut bufs: Vec<Vec<f32>> = ws.iter().map(|w| Vec::with_capacity(m * w.rows)).collect();
    let ptrs: Vec<pool::SyncPtr<f32>> = bufs.iter_mut().map(|b| pool::SyncPtr(b.as_mut_ptr())).collect();
    pool::global().run(tasks.len(), &|t| match &tasks[t] {
        Task::Stream { w, rows } => ws[*w].stream_task(xq(ws[*w]), isa, rows.clone(), ptrs[*w].get()),
        Task::Packed { w, tile, rows } => ws[*w].packed_task(xq(ws[*w]), isa, *tile, rows.clone(), ptrs[*w].get()),
    });
    bufs.into_iter()
        .zip(ws)
        .map(|(mut b, w)| {
            // SAFETY: the region above wrote all `m × rows` values (every weight row of a
            // streaming task for every activation row; every column of a packed tile for its
            // rows; the tasks of each weight cover its rows and tiles).
            unsafe { b.set_len(m * w.rows) };
            Matrix::from_vec(m, w.rows, b).expect("m × rows values")
        })
        .collect()
}

/// The panel a kernel set packs `format` into.
fn panel_spec(format: QuantFormat, isa: Isa) -> packed::PanelSpec {
    match isa {
        Isa::Portable => packed::PanelSpec { nr: 8, signed: false },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if packed::needs_signed(format) => packed_avx2::SPEC_SIGNED,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => packed_avx2::SPEC_UNSIGNED,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => packed_vnni::SPEC,
        #[cfg(not(target_arch = "x86_64"))]
        _ => {
            let _ = format;
            unreachable!("x86 kernels on another architecture")
        }
    }
}
