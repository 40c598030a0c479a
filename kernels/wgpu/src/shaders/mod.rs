//! WGSL source of the engine's kernels, generated per tile shape, weight layout and weight
//! element type.
//!
//! The GEMM is the classic register-blocked SGEMM: a workgroup owns a `BM×BN` tile of the
//! output, stages `BM×BK` of `X` and `BK×BN` of `W` in workgroup memory, and each thread
//! accumulates a `TM×TN` block in registers. The next `BK` slice is fetched into registers
//! while the current one is multiplied, so global-memory latency overlaps arithmetic. The
//! inner product is generated unrolled over named `vec4` accumulators so that no driver has
//! to prove an array fits in registers. Weights stay in the layout they were registered in
//! (`InOut` or PyTorch's `OutIn`): only the tile loader differs. 16-bit weights are stored
//! two per `u32` and widened in the loader, which needs no `shader-f16` device feature and
//! keeps every product in f32.
//!
//! One file per kernel family: [`gemm_wgsl`] (the register-blocked GEMM, and the choice
//! among the families) in `gemm.rs`, the few-row decode product in `skinny.rs`, the
//! cooperative-matrix GEMM in `coop.rs`, the split-K sum in `reduce.rs`, the row softmax
//! in `softmax.rs`, and the integer GEMM modulo 2^32 of the `dual-lpn` protection in
//! `ring.rs`. This file holds what they share: tiles, pipeline keys and the parameter
//! blocks the host writes.

use tensor::WeightLayout;

mod coop;
mod gemm;
mod reduce;
mod ring;
mod skinny;
mod softmax;

pub use gemm::gemm_wgsl;
pub use reduce::reduce_wgsl;
pub use ring::{RING_SKINNY_TILES, RING_TILES, RingKernel, RingKey, RingTile, ring_wgsl};
pub(crate) use ring::{RingParams, pack_ring};
pub use softmax::softmax_wgsl;

/// Bytes of one dispatch's parameter block: the uniform binding's dynamic-offset stride.
pub(crate) const PARAMS_BYTES: u64 = 256;

/// Threads of a softmax workgroup (one workgroup per row).
pub(crate) const SOFTMAX_THREADS: u32 = 128;

/// How a weight's elements are stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightType {
    F32,
    /// IEEE binary16, two per `u32` word, rows padded to an even length.
    F16,
    /// bfloat16, two per `u32` word, rows padded to an even length. Widening is a shift,
    /// so products equal those of the f32 values exactly.
    Bf16,
}

/// Output tile of one workgroup and the per-thread register block, or, for a cooperative
/// tile, the 16×16 matrix fragments one subgroup multiplies on the matrix units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
    /// Vulkan cooperative matrices (tensor cores): f16 operands, f32 accumulation. `tm × tn`
    /// is then the block of 16×16 fragments each subgroup of [`COOP_THREADS`] invocations
    /// owns; a workgroup is `(bm / 16tm) × (bn / 16tn)` subgroups.
    pub coop: bool,
    /// The few-row kernel (decode): at most `bm` rows, `bn` columns per workgroup, `tn`
    /// columns per thread, `bk` threads splitting `K` for each group of columns.
    pub skinny: bool,
}

/// Invocations of a subgroup on the GPUs the cooperative kernels are enabled on.
pub const COOP_THREADS: u32 = 32;

/// Padding of a staged row of f16 values in workgroup memory (keeps 16-byte alignment for
/// the fragment loads and spreads rows over the banks).
const COOP_PAD: u32 = 8;

impl Tile {
    pub const fn new(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32) -> Self {
        Tile { bm, bn, bk, tm, tn, coop: false, skinny: false }
    }

    /// A few-row tile: up to `bm` rows by `bn` columns, 4 columns per thread, `lanes`
    /// threads along `K` per column group, each issuing `unroll` 16-byte loads per column
    /// before using them.
    pub const fn skinny(bm: u32, bn: u32, lanes: u32, unroll: u32) -> Self {
        Tile { bm, bn, bk: lanes, tm: unroll, tn: 4, coop: false, skinny: true }
    }

    /// A cooperative tile: `bm × bn` per workgroup, `fm × fn` fragments per subgroup.
    pub const fn coop(bm: u32, bn: u32, bk: u32, fm: u32, fn_: u32) -> Self {
        Tile { bm, bn, bk, tm: fm, tn: fn_, coop: true, skinny: false }
    }

    /// Subgroups of a cooperative workgroup along M and N.
    fn subgroups(&self) -> (u32, u32) {
        (self.bm / (16 * self.tm), self.bn / (16 * self.tn))
    }

    pub fn threads(&self) -> u32 {
        if self.skinny {
            return (self.bn / self.tn) * self.bk;
        }
        if self.coop {
            let (sm, sn) = self.subgroups();
            return COOP_THREADS * sm * sn;
        }
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Workgroup memory the tile stages (both operands, padded rows; cooperative tiles also
    /// stage their f32 result).
    pub fn shared_bytes(&self) -> u32 {
        if self.skinny {
            // Every thread's partial sums, reduced over the `bk` threads of a column group.
            return 4 * self.threads() * self.bm * self.tn;
        }
        if self.coop {
            let (sm, sn) = self.subgroups();
            let w = (self.bn * (self.bk + COOP_PAD)).max(self.bk * (self.bn + COOP_PAD));
            return 2 * self.bm * (self.bk + COOP_PAD) + 2 * w + 4 * 256 * sm * sn;
        }
        4 * self.bk * ((self.bm + 4) + (self.bn + 4))
    }

    /// Whether the generator supports this shape: `vec4` register blocks, loads that divide
    /// evenly among the threads.
    pub fn is_valid(&self) -> bool {
        let t = self.threads();
        if self.skinny {
            return self.bm > 0
                && self.bm <= 16
                && (1..=4).contains(&self.tm)
                && self.tn > 0
                && self.bn.is_multiple_of(self.tn)
                && t >= 32;
        }
        if self.coop {
            return [self.bm, self.bn, self.bk].iter().all(|&v| v % 16 == 0 && v > 0)
                && self.tm > 0
                && self.tn > 0
                && self.bm.is_multiple_of(16 * self.tm)
                && self.bn.is_multiple_of(16 * self.tn)
                && (self.bm * self.bk).is_multiple_of(t)
                && t <= 1024;
        }
        [self.tm, self.tn].iter().all(|&v| v == 4 || v == 8)
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (self.bm * self.bk).is_multiple_of(t)
            && (self.bn * self.bk).is_multiple_of(t)
            && t >= 16
    }

    pub fn name(&self) -> String {
        if self.skinny {
            return format!("skinny{}x{}/{}x{}", self.bm, self.bn, self.bk, self.tm);
        }
        if self.coop {
            return format!("coop{}x{}x{}/{}x{}", self.bm, self.bn, self.bk, self.tm, self.tn);
        }
        format!("{}x{}x{}/{}x{}", self.bm, self.bn, self.bk, self.tm, self.tn)
    }
}

/// Cooperative-matrix tiles, used only when the engine is opened with tensor cores on.
pub const COOP_TILES: [Tile; 9] = [
    Tile::coop(128, 128, 64, 4, 2),
    Tile::coop(128, 128, 32, 4, 2),
    Tile::coop(128, 64, 32, 4, 2),
    Tile::coop(64, 128, 64, 2, 4),
    Tile::coop(64, 128, 32, 2, 4),
    Tile::coop(64, 64, 32, 2, 2),
    Tile::coop(32, 64, 32, 2, 2),
    Tile::coop(16, 128, 32, 1, 2),
    Tile::coop(16, 64, 64, 1, 2),
];

/// Few-row tiles for decode products: per row class (1, 2, 4, 8, 9 and 16 rows: a masked
/// decode step's linears have 1 + 8 shield rows, which the 16-row tiles computed with 7
/// rows of zeros) the basic tile, the same issuing two loads per column ahead, and a
/// 16-lane tile that reads 256 contiguous bytes of a weight row per step. Autotuning tries
/// those of a product's class and of the next power of two.
pub const SKINNY_TILES: [Tile; 18] = [
    Tile::skinny(1, 64, 8, 1),
    Tile::skinny(1, 64, 8, 2),
    Tile::skinny(1, 32, 16, 2),
    Tile::skinny(2, 64, 8, 1),
    Tile::skinny(2, 64, 8, 2),
    Tile::skinny(2, 32, 16, 2),
    Tile::skinny(4, 32, 8, 1),
    Tile::skinny(4, 32, 8, 2),
    Tile::skinny(4, 32, 16, 2),
    Tile::skinny(8, 32, 8, 1),
    Tile::skinny(8, 32, 8, 2),
    Tile::skinny(8, 16, 16, 2),
    Tile::skinny(9, 32, 8, 1),
    Tile::skinny(9, 32, 8, 2),
    Tile::skinny(9, 16, 16, 2),
    Tile::skinny(16, 32, 8, 1),
    Tile::skinny(16, 32, 8, 2),
    Tile::skinny(16, 16, 16, 2),
];

/// The tiles the engine chooses among, largest first. Which wins depends on the GPU (its
/// registers per thread decide whether an 8×8 block keeps enough workgroups resident) and
/// on the product's shape; autotuning measures them.
///
/// The 72- and 36-row tiles fit a masked decode step with per-sequence masks exactly: each
/// sequence sends one row under 8 shield rows, so a step of `B` sequences is `9·B` rows
/// (72 at B = 8, 36 for each of two decode groups of 4). On power-of-two tiles those
/// products computed 44 % padding rows (72 rows on a 128-row tile or two 64-row ones).
/// Nine rows of threads make 144-thread workgroups, four and a half 32-wide subgroups;
/// the 72×128 tile has 288 threads, nine whole ones.
pub const TILES: [Tile; 13] = [
    Tile::new(128, 128, 16, 8, 8),
    Tile::new(128, 128, 8, 8, 8),
    Tile::new(128, 64, 16, 8, 4),
    Tile::new(72, 128, 36, 8, 4),
    Tile::new(72, 64, 18, 8, 4),
    Tile::new(72, 64, 36, 8, 4),
    Tile::new(64, 128, 16, 8, 8),
    Tile::new(64, 64, 16, 4, 4),
    Tile::new(64, 64, 32, 4, 4),
    Tile::new(36, 64, 36, 4, 4),
    Tile::new(32, 64, 32, 4, 4),
    Tile::new(16, 64, 32, 4, 4),
    Tile::new(16, 32, 32, 4, 4),
];

/// What one GEMM pipeline is specialised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmKey {
    pub tile: Tile,
    pub layout: WeightLayout,
    pub wtype: WeightType,
}

impl std::hash::Hash for GemmKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.tile.hash(state);
        matches!(self.layout, WeightLayout::OutIn).hash(state);
        self.wtype.hash(state);
    }
}

/// The uniform block every GEMM dispatch reads (16-byte rows, as WGSL lays them out).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct GemmParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub _p0: u32,
    /// Offset (elements) of `X` in its binding, its row stride and batch stride.
    pub x_off: u32,
    pub x_ld: u32,
    pub x_bs: u32,
    pub _p1: u32,
    /// Offset, row stride and batch stride of `W` (elements, also for packed 16-bit).
    pub w_off: u32,
    pub w_ld: u32,
    pub w_bs: u32,
    pub _p2: u32,
    pub o_off: u32,
    pub o_ld: u32,
    pub o_bs: u32,
    pub _p3: u32,
}

/// Sum of split-K partial products: `os[dst + i] = Σ_z os[src + z·stride + i]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ReduceParams {
    pub count: u32,
    pub splits: u32,
    pub src: u32,
    pub dst: u32,
    pub stride: u32,
    /// Threads along x of the dispatch grid (workgroups × 256).
    pub row: u32,
    pub _p0: u32,
    pub _p1: u32,
}

/// Threads of a reduce workgroup.
pub(crate) const REDUCE_THREADS: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct SoftmaxParams {
    pub rows: u32,
    pub cols: u32,
    pub scale: f32,
    /// Workgroups along x: rows are spread over a 2-D grid past the 65535 limit.
    pub grid_x: u32,
    pub x_off: u32,
    pub o_off: u32,
    pub _p0: u32,
    pub _p1: u32,
}

const BINDINGS: &str = r#"
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read_write> os: array<f32>;
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(src: &str) {
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(src)));
        // Vulkan devices always have the f16-in-f32 packing builtins (`unpack2x16float`).
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32,
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    }

    #[test]
    fn every_gemm_variant_is_valid_wgsl() {
        for tile in TILES {
            assert!(tile.is_valid(), "{tile:?}");
            for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
                for wtype in [WeightType::F32, WeightType::F16, WeightType::Bf16] {
                    validate(&gemm_wgsl(&GemmKey { tile, layout, wtype }));
                }
            }
        }
    }

    #[test]
    fn every_skinny_variant_is_valid_wgsl() {
        for tile in SKINNY_TILES {
            assert!(tile.is_valid(), "{tile:?}");
            for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
                for wtype in [WeightType::F32, WeightType::F16, WeightType::Bf16] {
                    validate(&gemm_wgsl(&GemmKey { tile, layout, wtype }));
                }
            }
        }
    }

    #[test]
    fn every_cooperative_variant_is_valid_wgsl_and_spirv() {
        let caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32
            | naga::valid::Capabilities::SHADER_FLOAT16
            | naga::valid::Capabilities::COOPERATIVE_MATRIX;
        for tile in COOP_TILES {
            assert!(tile.is_valid(), "{tile:?}");
            for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
                for wtype in [WeightType::F32, WeightType::F16, WeightType::Bf16] {
                    let src = gemm_wgsl(&GemmKey { tile, layout, wtype });
                    let module = naga::front::wgsl::parse_str(&src)
                        .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(&src)));
                    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                        .validate(&module)
                        .unwrap_or_else(|e| panic!("{e:?}\n{src}"));
                    // What wgpu hands the Vulkan driver: SPIR-V 1.3 with the KHR extension.
                    let opts = naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
                    naga::back::spv::write_vec(&module, &info, &opts, None).unwrap_or_else(|e| panic!("{e:?}\n{src}"));
                }
            }
        }
    }

    #[test]
    fn every_ring_variant_is_valid_wgsl() {
        for kernel in [RingKernel::U32, RingKernel::Dot4] {
            for tile in RING_TILES.iter().filter(|t| t.is_valid(kernel)).chain(&RING_SKINNY_TILES) {
                validate(&ring_wgsl(&RingKey { tile: *tile, kernel }));
            }
        }
        assert!(!RING_TILES[0].is_valid(RingKernel::Dot4), "four planes of 8×8 accumulators are too many");
        assert!(RING_TILES.iter().all(|t| t.is_valid(RingKernel::U32)));
        assert!(RING_SKINNY_TILES.iter().all(|t| t.is_valid(RingKernel::U32)));
    }

    #[test]
    fn softmax_and_reduce_are_valid_wgsl() {
        validate(&softmax_wgsl());
        validate(&reduce_wgsl());
    }

    #[test]
    fn params_blocks_fit_the_dynamic_offset_stride() {
        assert!(std::mem::size_of::<GemmParams>() as u64 <= PARAMS_BYTES);
        assert!(std::mem::size_of::<SoftmaxParams>() as u64 <= PARAMS_BYTES);
        assert!(std::mem::size_of::<ReduceParams>() as u64 <= PARAMS_BYTES);
        assert!(std::mem::size_of::<RingParams>() as u64 <= PARAMS_BYTES);
    }
}
