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
mod portable;
#[cfg(target_arch = "x86_64")]
mod stream_avx2;
#[cfg(test)]
mod tests;

use std::{
    cell::RefCell,
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
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
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
        assert_eq!(x.cols(), self.cols, "product input width");
        let m = x.rows();
        let mut out = Matrix::zeros(m, self.rows);
        if m == 0 {
            return out;
        }
        if m >= PACKED_MIN_ROWS {
            let xq = QuantRows::new(x.as_slice(), m, self.cols, packed_kind(self.format));
            self.packed(&xq, isa, out.as_mut_slice());
        } else {
            let xq = QuantRows::new(x.as_slice(), m, self.cols, stream_kind(self.format));
            self.stream(&xq, isa, out.as_mut_slice());
        }
        out
    }

    /// Tiles of weight rows unpacked into panels, each against a chunk of activation rows.
    fn packed(&self, xq: &QuantRows, isa: Isa, out: &mut [f32]) {
        thread_local! {
            static PANEL: RefCell<packed::Panel> = RefCell::default();
        }
        let spec = match isa {
            Isa::Portable => packed::PanelSpec { nr: 8, signed: false },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if packed::needs_signed(self.format) => packed_avx2::SPEC_SIGNED,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => packed_avx2::SPEC_UNSIGNED,
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("x86 kernels on another architecture"),
        };
        let g = portable::group(self.format);
        let m = xq.rows();
        let tiles = self.rows.div_ceil(spec.nr);
        // Split the rows only as far as the pool needs tasks: every task unpacks its tile.
        let wanted = pool::global().threads() * 4;
        let chunks = wanted.div_ceil(tiles).clamp(1, m.div_ceil(PACKED_MIN_CHUNK));
        let chunk = m.div_ceil(chunks);
        let ptr = pool::SyncPtr(out.as_mut_ptr());
        let ldo = self.rows;
        pool::global().run(tiles * chunks, &|task| {
            let (t, c) = (task / chunks, task % chunks);
            let o0 = t * spec.nr;
            let cols = spec.nr.min(self.rows - o0);
            let rows = c * chunk..((c + 1) * chunk).min(m);
            PANEL.with_borrow_mut(|panel| {
                packed::pack(self, o0, spec, isa, panel);
                match isa {
                    Isa::Portable => {
                        packed::tile_portable(panel, spec, g, xq, rows.start, rows.len(), ptr.get(), ldo, o0, cols)
                    }
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `Avx2` is only chosen where the CPU runs it; the panel was packed
                    // for it from a weight as wide as `xq`, quantized in groups of `g`; this
                    // task owns columns `o0..o0 + cols` of rows `rows`.
                    Isa::Avx2 => unsafe {
                        packed_avx2::tile_rows(panel, spec.signed, g, xq, rows, ptr.get(), ldo, o0, cols)
                    },
                    #[cfg(not(target_arch = "x86_64"))]
                    _ => unreachable!("x86 kernels on another architecture"),
                }
            });
        });
    }

    /// The streaming kernels over every weight row, split over the pool.
    fn stream(&self, xq: &QuantRows, isa: Isa, out: &mut [f32]) {
        let rb = self.row_bytes();
        let ptr = pool::SyncPtr(out.as_mut_ptr());
        let ldo = self.rows;
        // About 16 KB of weights a piece: enough to hide the claim, small enough to balance.
        let min_rows = (16384 / rb).max(1);
        pool::global().for_ranges(self.rows, min_rows, &|range| match isa {
            Isa::Portable => {
                for o in range {
                    let w = &self.bytes[o * rb..(o + 1) * rb];
                    for j in 0..xq.rows() {
                        // SAFETY: this task owns columns `range` of `out`.
                        unsafe { *ptr.get().add(j * ldo + o) = portable::dot(self.format, w, xq.row(j), xq.kind) };
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only chosen where the CPU runs it; the rows and blocks
            // were checked at construction and quantization; columns `range` are ours.
            Isa::Avx2 => unsafe { stream_avx2::rows(self.format, &self.bytes, rb, range, xq, ptr.get(), ldo) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("x86 kernels on another architecture"),
        });
    }
}
