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

use std::fmt::Write;

use kernels::WeightLayout;

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

/// WGSL of the GEMM `O[b] = X[b] · W[b]` for one key.
pub fn gemm_wgsl(key: &GemmKey) -> String {
    if key.tile.coop {
        return coop_wgsl(key);
    }
    if key.tile.skinny {
        return skinny_wgsl(key);
    }
    let Tile { bm, bn, bk, tm, tn, .. } = key.tile;
    let (wx, wy) = (bn / tn, bm / tm);
    let threads = wx * wy;
    let (sa, sb) = (bm + 4, bn + 4);
    let (lx, lw) = (bm * bk / threads, bn * bk / threads);
    let mut s = String::new();
    let w = &mut s;
    let wty = if key.wtype == WeightType::F32 { "f32" } else { "u32" };
    writeln!(
        w,
        "struct Params {{ m: u32, n: u32, k: u32, p0: u32, x_off: u32, x_ld: u32, x_bs: u32, p1: u32,
  w_off: u32, w_ld: u32, w_bs: u32, p2: u32, o_off: u32, o_ld: u32, o_bs: u32, p3: u32 }}"
    )
    .unwrap();
    w.push_str(BINDINGS);
    writeln!(w, "@group(0) @binding(2) var<storage, read> ws: array<{wty}>;").unwrap();
    writeln!(
        w,
        "const BM: u32 = {bm}u; const BN: u32 = {bn}u; const BK: u32 = {bk}u;
const WX: u32 = {wx}u; const WY: u32 = {wy}u; const T: u32 = {threads}u;
const SA: u32 = {sa}u; const SB: u32 = {sb}u;
var<workgroup> sa: array<vec4<f32>, {}>;
var<workgroup> sb: array<vec4<f32>, {}>;",
        bk * sa / 4,
        bk * sb / 4
    )
    .unwrap();

    // Element `e` (row-major index into the weight's storage, offsets included) as f32.
    let load = match key.wtype {
        WeightType::F32 => "ws[e]".to_string(),
        WeightType::F16 => "unpack2x16float(ws[e >> 1u])[e & 1u]".to_string(),
        WeightType::Bf16 => {
            "bitcast<f32>(select(ws[e >> 1u] << 16u, ws[e >> 1u] & 0xffff0000u, (e & 1u) == 1u))".to_string()
        }
    };
    writeln!(w, "fn wload(e: u32) -> f32 {{ return {load}; }}").unwrap();

    writeln!(
        w,
        "@compute @workgroup_size({wx}, {wy}, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{
  let tx = lid.x; let ty = lid.y; let tid = ty * WX + tx;
  let m0 = wid.y * BM; let n0 = wid.x * BN;
  let xb = p.x_off + wid.z * p.x_bs;
  let wb = p.w_off + wid.z * p.w_bs;
  let ob = p.o_off + wid.z * p.o_bs;"
    )
    .unwrap();
    let (gm, gn) = (tm / 4, tn / 4);
    for r in 0..tm {
        for h in 0..gn {
            writeln!(w, "  var c{r}_{h} = vec4<f32>(0.0);").unwrap();
        }
    }
    for i in 0..lx {
        writeln!(w, "  var rx{i}: f32;").unwrap();
    }
    for i in 0..lw {
        writeln!(w, "  var rw{i}: f32;").unwrap();
    }
    // Global → registers for the slice starting at k0; out-of-range elements load as 0.
    let mut fetch = String::new();
    for i in 0..lx {
        let e = i * threads;
        writeln!(
            fetch,
            "    {{ let e = tid + {e}u; let r = m0 + e / BK; let c = k0 + e % BK;
      rx{i} = 0.0; if (r < p.m && c < p.k) {{ rx{i} = xs[xb + r * p.x_ld + c]; }} }}"
        )
        .unwrap();
    }
    for i in 0..lw {
        let e = i * threads;
        let (kk, col, idx) = match key.layout {
            WeightLayout::InOut => ("e / BN", "e % BN", "wb + kg * p.w_ld + ng"),
            WeightLayout::OutIn => ("e % BK", "e / BK", "wb + ng * p.w_ld + kg"),
        };
        writeln!(
            fetch,
            "    {{ let e = tid + {e}u; let kg = k0 + {kk}; let ng = n0 + {col};
      rw{i} = 0.0; if (kg < p.k && ng < p.n) {{ rw{i} = wload({idx}); }} }}"
        )
        .unwrap();
    }
    // Registers → workgroup memory, transposed so the inner loop reads rows as vec4.
    let mut stash = String::new();
    for i in 0..lx {
        let e = i * threads;
        writeln!(stash, "    {{ let e = tid + {e}u; let i = (e % BK) * SA + e / BK; sa[i >> 2u][i & 3u] = rx{i}; }}")
            .unwrap();
    }
    for i in 0..lw {
        let e = i * threads;
        let (kk, col) = match key.layout {
            WeightLayout::InOut => ("e / BN", "e % BN"),
            WeightLayout::OutIn => ("e % BK", "e / BK"),
        };
        writeln!(stash, "    {{ let e = tid + {e}u; let i = ({kk}) * SB + {col}; sb[i >> 2u][i & 3u] = rw{i}; }}")
            .unwrap();
    }

    writeln!(w, "  var k0 = 0u;\n{fetch}  loop {{\n    if (k0 >= p.k) {{ break; }}\n{stash}    workgroupBarrier();\n    k0 += BK;\n    if (k0 < p.k) {{\n{fetch}    }}").unwrap();
    writeln!(w, "    for (var kk = 0u; kk < BK; kk++) {{").unwrap();
    for g in 0..gm {
        writeln!(w, "      let a{g} = sa[kk * (SA / 4u) + {}u * WY + ty];", g).unwrap();
    }
    for h in 0..gn {
        writeln!(w, "      let b{h} = sb[kk * (SB / 4u) + {}u * WX + tx];", h).unwrap();
    }
    let comp = ["x", "y", "z", "w"];
    for g in 0..gm {
        for (i, cmp) in comp.iter().enumerate() {
            let r = g * 4 + i as u32;
            for h in 0..gn {
                writeln!(w, "      c{r}_{h} = fma(vec4<f32>(a{g}.{cmp}), b{h}, c{r}_{h});").unwrap();
            }
        }
    }
    writeln!(w, "    }}\n    workgroupBarrier();\n  }}").unwrap();

    // Thread (tx, ty) owns rows g*4*WY + 4*ty + i and columns h*4*WX + 4*tx + j.
    for g in 0..gm {
        for i in 0..4 {
            let r = g * 4 + i;
            writeln!(w, "  {{ let row = m0 + {}u * WY + 4u * ty + {i}u;\n    if (row < p.m) {{", g * 4).unwrap();
            for h in 0..gn {
                writeln!(
                    w,
                    "      {{ let col = n0 + {}u * WX + 4u * tx; let o = ob + row * p.o_ld + col;
        if (col + 3u < p.n) {{ os[o] = c{r}_{h}.x; os[o + 1u] = c{r}_{h}.y; os[o + 2u] = c{r}_{h}.z; os[o + 3u] = c{r}_{h}.w; }}
        else {{ if (col < p.n) {{ os[o] = c{r}_{h}.x; }} if (col + 1u < p.n) {{ os[o + 1u] = c{r}_{h}.y; }} if (col + 2u < p.n) {{ os[o + 2u] = c{r}_{h}.z; }} }} }}",
                    h * 4
                )
                .unwrap();
            }
            writeln!(w, "    }}\n  }}").unwrap();
        }
    }
    w.push_str("}\n");
    s
}

/// WGSL of the few-row product (decode: a handful of rows against a large weight). The
/// weight is streamed once: each thread owns `CPT` columns and every `L`-th vector of `K`
/// (the `L` threads of a column group read consecutive 16-byte words of a checkpoint-layout
/// row: 4 f32 or 8 16-bit values), issues the loads of `U` such words per column before
/// using any (enough bytes in flight to keep HBM busy with few threads), multiplies them
/// with all `BM` rows of `X` (read once per element, shared by its columns), and the
/// partial sums are reduced over the group in workgroup memory. Unaligned shapes and the
/// `InOut` layout take a scalar loop. Rows beyond `m` read as 0; products and sums are f32.
fn skinny_wgsl(key: &GemmKey) -> String {
    let Tile { bm, bn, bk: l, tm: u, tn: cpt, .. } = key.tile;
    let t = key.tile.threads();
    let mut s = String::new();
    let w = &mut s;
    writeln!(
        w,
        "struct Params {{ m: u32, n: u32, k: u32, p0: u32, x_off: u32, x_ld: u32, x_bs: u32, p1: u32,
  w_off: u32, w_ld: u32, w_bs: u32, p2: u32, o_off: u32, o_ld: u32, o_bs: u32, p3: u32 }}"
    )
    .unwrap();
    // Checkpoint-layout weights are viewed as 16-byte words for the aligned path; scalar
    // reads pick a lane (and, for 16-bit values, a half of it).
    let vec = key.layout == WeightLayout::OutIn;
    let wide = key.wtype != WeightType::F32;
    let wty = match (vec, wide) {
        (true, false) => "vec4<f32>",
        (true, true) => "vec4<u32>",
        (false, false) => "f32",
        (false, true) => "u32",
    };
    writeln!(
        w,
        "@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ws: array<{wty}>;
@group(0) @binding(3) var<storage, read_write> os: array<f32>;
fn xload(e: u32) -> f32 {{ return xs[e >> 2u][e & 3u]; }}"
    )
    .unwrap();
    let word = if vec { "ws[e >> 3u][(e >> 1u) & 3u]" } else { "ws[e >> 1u]" };
    let load = match key.wtype {
        WeightType::F32 if vec => "ws[e >> 2u][e & 3u]".to_string(),
        WeightType::F32 => "ws[e]".to_string(),
        WeightType::F16 => format!("unpack2x16float({word})[e & 1u]"),
        WeightType::Bf16 => format!("bitcast<f32>(select({word} << 16u, {word} & 0xffff0000u, (e & 1u) == 1u))"),
    };
    writeln!(w, "fn wload(e: u32) -> f32 {{ return {load}; }}").unwrap();
    let acc = bm * cpt;
    writeln!(
        w,
        "const BM: u32 = {bm}u; const BN: u32 = {bn}u; const L: u32 = {l}u; const CPT: u32 = {cpt}u; const T: u32 = {t}u;
const ACC: u32 = {acc}u;
var<workgroup> red: array<f32, {}>;
@compute @workgroup_size({t}, 1, 1)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
  let lane = t % L; let g = t / L;
  let m0 = wid.y * BM; let nc = wid.x * BN + g * CPT;
  let xb = p.x_off + wid.z * p.x_bs;
  let wb = p.w_off + wid.z * p.w_bs;
  let ob = p.o_off + wid.z * p.o_bs;",
        t * acc
    )
    .unwrap();
    for r in 0..bm {
        for c in 0..cpt {
            writeln!(w, "  var a{r}_{c} = 0.0;").unwrap();
        }
    }
    if vec {
        // Values per 16-byte word of the weight; X rows are read as 1 or 2 vec4 per word.
        let vw = if wide { 8 } else { 4 };
        let (wzero, xper) = if wide { ("vec4<u32>(0u)", 2) } else { ("vec4<f32>(0.0)", 1) };
        writeln!(
            w,
            "  let aligned = (p.k % {vw}u == 0u) & (p.w_ld % {vw}u == 0u) & (wb % {vw}u == 0u) & (p.x_ld % 4u == 0u) & (xb % 4u == 0u);
  if (aligned) {{
    let kn = p.k / {vw}u;
    for (var k0 = lane; k0 < kn; k0 += L * {u}u) {{"
        )
        .unwrap();
        // Every load of the step first, then the arithmetic.
        for j in 0..u {
            writeln!(w, "      let k{j} = k0 + {}u; let in{j} = k{j} < kn;", j * l).unwrap();
            for c in 0..cpt {
                writeln!(
                    w,
                    "      var w{c}_{j} = {wzero}; if (in{j} && nc + {c}u < p.n) {{ w{c}_{j} = ws[(wb + (nc + {c}u) * p.w_ld) / {vw}u + k{j}]; }}"
                )
                .unwrap();
            }
        }
        for j in 0..u {
            if wide {
                for c in 0..cpt {
                    let (lo, hi) = match key.wtype {
                        WeightType::F16 => (
                            format!("vec4<f32>(unpack2x16float(w{c}_{j}.x), unpack2x16float(w{c}_{j}.y))"),
                            format!("vec4<f32>(unpack2x16float(w{c}_{j}.z), unpack2x16float(w{c}_{j}.w))"),
                        ),
                        _ => (
                            format!(
                                "bitcast<vec4<f32>>(vec4<u32>(w{c}_{j}.x << 16u, w{c}_{j}.x & 0xffff0000u, w{c}_{j}.y << 16u, w{c}_{j}.y & 0xffff0000u))"
                            ),
                            format!(
                                "bitcast<vec4<f32>>(vec4<u32>(w{c}_{j}.z << 16u, w{c}_{j}.z & 0xffff0000u, w{c}_{j}.w << 16u, w{c}_{j}.w & 0xffff0000u))"
                            ),
                        ),
                    };
                    writeln!(w, "      let wl{c}_{j} = {lo}; let wh{c}_{j} = {hi};").unwrap();
                }
            }
            for r in 0..bm {
                writeln!(
                    w,
                    "      {{ var xl = vec4<f32>(0.0); var xh = vec4<f32>(0.0);
        if (in{j} && m0 + {r}u < p.m) {{ let xi = (xb + (m0 + {r}u) * p.x_ld) / 4u + {xper}u * k{j}; xl = xs[xi];{} }}",
                    if wide { " xh = xs[xi + 1u];" } else { "" }
                )
                .unwrap();
                for c in 0..cpt {
                    if wide {
                        writeln!(w, "        a{r}_{c} += dot(xl, wl{c}_{j}) + dot(xh, wh{c}_{j});").unwrap();
                    } else {
                        writeln!(w, "        a{r}_{c} += dot(xl, w{c}_{j});").unwrap();
                    }
                }
                writeln!(w, "      }}").unwrap();
            }
        }
        writeln!(w, "    }}\n  }} else {{").unwrap();
    }
    let widx = |c: u32| match key.layout {
        WeightLayout::OutIn => format!("wb + (nc + {c}u) * p.w_ld + k"),
        WeightLayout::InOut => format!("wb + k * p.w_ld + nc + {c}u"),
    };
    writeln!(w, "  for (var k = lane; k < p.k; k += L) {{").unwrap();
    for c in 0..cpt {
        writeln!(w, "    var w{c} = 0.0; if (nc + {c}u < p.n) {{ w{c} = wload({}); }}", widx(c)).unwrap();
    }
    for r in 0..bm {
        writeln!(w, "    var x{r} = 0.0; if (m0 + {r}u < p.m) {{ x{r} = xload(xb + (m0 + {r}u) * p.x_ld + k); }}")
            .unwrap();
        for c in 0..cpt {
            writeln!(w, "    a{r}_{c} = fma(x{r}, w{c}, a{r}_{c});").unwrap();
        }
    }
    writeln!(w, "  }}").unwrap();
    if vec {
        writeln!(w, "  }}").unwrap();
    }
    for r in 0..bm {
        for c in 0..cpt {
            writeln!(w, "  red[t * ACC + {}u] = a{r}_{c};", r * cpt + c).unwrap();
        }
    }
    writeln!(
        w,
        "  workgroupBarrier();
  // One output per step: the sum over the group's L threads of one (row, column) partial.
  for (var e = t; e < BM * BN; e += T) {{
    let r = e / BN; let cl = e % BN; let gg = cl / CPT; let c = cl % CPT;
    let row = m0 + r; let col = wid.x * BN + cl;
    if (row < p.m && col < p.n) {{
      var sum = 0.0;
      for (var i = 0u; i < L; i++) {{ sum += red[(gg * L + i) * ACC + r * CPT + c]; }}
      os[ob + row * p.o_ld + col] = sum;
    }}
  }}
}}"
    )
    .unwrap();
    s
}

/// WGSL of the GEMM on cooperative matrices. A workgroup of several subgroups owns a
/// `BM×BN` tile; each subgroup multiplies its `FM×FN` block of 16×16 fragments on the matrix
/// units into f32 accumulators. `X` (f32 activations) is staged once per `BK` slice into
/// workgroup memory as f16, shared by every subgroup. f16 weights in `OutIn` layout (as
/// checkpoints arrive) are read straight from device memory as column-major fragments —
/// no staging, no conversion — wherever the workgroup's columns and the whole `K` are full
/// tiles; other weights, and edge tiles, are staged through workgroup memory as f16 with
/// bounds checks. Full output tiles with 16-byte aligned rows are stored straight to device
/// memory, others through a per-subgroup scratch fragment with bounds. Both operands are
/// rounded to f16.
fn coop_wgsl(key: &GemmKey) -> String {
    let tile = key.tile;
    let Tile { bm, bn, bk, tm: fm, tn: fnn, .. } = tile;
    let (sgm, sgn) = tile.subgroups();
    let t = tile.threads();
    let pad = COOP_PAD;
    let direct = key.wtype == WeightType::F16 && key.layout == WeightLayout::OutIn;
    let mut s = String::from("enable f16;\nenable wgpu_cooperative_matrix;\n");
    let w = &mut s;
    writeln!(
        w,
        "struct Params {{ m: u32, n: u32, k: u32, p0: u32, x_off: u32, x_ld: u32, x_bs: u32, p1: u32,
  w_off: u32, w_ld: u32, w_bs: u32, p2: u32, o_off: u32, o_ld: u32, o_bs: u32, p3: u32 }}"
    )
    .unwrap();
    w.push_str(BINDINGS);
    // The weight binding's view: f16 elements where fragments load from it directly.
    let wty = match key.wtype {
        WeightType::F32 => "f32",
        WeightType::F16 if direct => "f16",
        _ => "u32",
    };
    writeln!(w, "@group(0) @binding(2) var<storage, read> ws: array<{wty}>;").unwrap();
    // Staged W: `[n][k]` (column-major fragments) for OutIn, `[k][n]` (row-major) for InOut.
    let (wb_len, sw) = match key.layout {
        WeightLayout::OutIn => (bn * (bk + pad), bk + pad),
        WeightLayout::InOut => (bk * (bn + pad), bn + pad),
    };
    writeln!(
        w,
        "const BM: u32 = {bm}u; const BN: u32 = {bn}u; const BK: u32 = {bk}u; const T: u32 = {t}u;
const SA: u32 = {sa}u; const SW: u32 = {sw}u;
var<workgroup> xa: array<f16, {xa_len}>;
var<workgroup> wb: array<f16, {wb_len}>;
var<workgroup> scratch: array<f32, {sc_len}>;",
        sa = bk + pad,
        xa_len = bm * (bk + pad),
        sc_len = 256 * sgm * sgn,
    )
    .unwrap();
    let load = match key.wtype {
        WeightType::F32 => "f16(ws[e])",
        WeightType::F16 if direct => "ws[e]",
        // Exact: every f16 is an f32 and back.
        WeightType::F16 => "f16(unpack2x16float(ws[e >> 1u])[e & 1u])",
        WeightType::Bf16 => "f16(bitcast<f32>(select(ws[e >> 1u] << 16u, ws[e >> 1u] & 0xffff0000u, (e & 1u) == 1u)))",
    };
    writeln!(w, "fn wload(e: u32) -> f16 {{ return {load}; }}").unwrap();
    let (kl, nl, widx, wsl) = match key.layout {
        WeightLayout::InOut => ("e / BN", "e % BN", "wb0 + kg * p.w_ld + ng", "kl * SW + nl"),
        WeightLayout::OutIn => ("e % BK", "e / BK", "wb0 + ng * p.w_ld + kg", "nl * SW + kl"),
    };
    writeln!(
        w,
        "@compute @workgroup_size({t}, 1, 1)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
  let sg = t / {COOP_THREADS}u; let lane = t % {COOP_THREADS}u;
  let sm = sg / {sgn}u; let sn = sg % {sgn}u;
  let m0 = wid.y * BM; let n0 = wid.x * BN;
  let xb = p.x_off + wid.z * p.x_bs;
  let wb0 = p.w_off + wid.z * p.w_bs;
  let ob = p.o_off + wid.z * p.o_bs;
  // Strides as values: naga emits a fragment store's stride only from a named value.
  let o_ld = p.o_ld; let w_ld = p.w_ld;
  // Rows and columns of this subgroup's block within the tile.
  let rm = sm * {wm}u; let cn = sn * {wn}u;
  // Workgroup-uniform: this tile's columns and the whole K are full tiles, and rows and
  // start are 16-byte aligned as fragment loads require (`&`, not `&&`: naga lowers a
  // short-circuit through a variable its uniformity analysis cannot follow).
  let full = {full};",
        wm = 16 * fm,
        wn = 16 * fnn,
        full =
            if direct { "(n0 + BN <= p.n) & (p.k % BK == 0u) & (w_ld % 8u == 0u) & (wb0 % 8u == 0u)" } else { "false" },
    )
    .unwrap();
    for i in 0..fm {
        for j in 0..fnn {
            writeln!(w, "  var c{i}_{j} = coop_mat16x16<f32, C>();").unwrap();
        }
    }
    // Each thread's share of a `BM×BK` slice of X, held in registers between slices:
    // element `t + i·T` of the slice (consecutive threads read consecutive addresses).
    let lx = bm * bk / t;
    let fetch = |k: &str, ind: &str| {
        let mut f = String::new();
        for i in 0..lx {
            writeln!(
                f,
                "{ind}{{ let e = t + {o}u; let r = m0 + e / BK; let c = {k} + e % BK; xr{i} = 0.0;
{ind}  if (r < p.m && c < p.k) {{ xr{i} = xs[xb + r * p.x_ld + c]; }} }}",
                o = i * t
            )
            .unwrap();
        }
        f
    };
    let mut stores = String::new();
    for i in 0..lx {
        writeln!(stores, "    {{ let e = t + {o}u; xa[(e / BK) * SA + e % BK] = f16(xr{i}); }}", o = i * t).unwrap();
    }
    for i in 0..lx {
        writeln!(w, "  var xr{i}: f32;").unwrap();
    }
    w.push_str(&fetch("0u", "  "));
    writeln!(
        w,
        "  for (var k0 = 0u; k0 < p.k; k0 += BK) {{
    workgroupBarrier();
{stores}
    // The next slice of X is fetched into registers while this one is multiplied.
    let kn = k0 + BK;
{fetch_next}
    if (!full) {{
      for (var e = t; e < BK * BN; e += T) {{
        let kl = {kl}; let nl = {nl}; let kg = k0 + kl; let ng = n0 + nl;
        var v = f16(0.0); if (kg < p.k && ng < p.n) {{ v = wload({widx}); }}
        wb[{wsl}] = v;
      }}
    }}
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk += 16u) {{",
        stores = stores,
        fetch_next = fetch("kn", "      "),
    )
    .unwrap();
    for i in 0..fm {
        writeln!(w, "      let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&xa[(rm + {}u) * SA + kk], SA);", i * 16)
            .unwrap();
    }
    // B fragments: from device memory on full tiles (f16 OutIn), else from the staging.
    let staged_b = |j: u32| match key.layout {
        WeightLayout::OutIn => format!("coopLoad<coop_mat16x16<f16, B>>(&wb[(cn + {}u) * SW + kk], SW)", j * 16),
        WeightLayout::InOut => format!("coopLoadT<coop_mat16x16<f16, B>>(&wb[kk * SW + cn + {}u], SW)", j * 16),
    };
    for j in 0..fnn {
        if direct {
            writeln!(
                w,
                "      var b{j}: coop_mat16x16<f16, B>;
      if (full) {{ let wi{j} = wb0 + (n0 + cn + {o}u) * w_ld + k0 + kk; b{j} = coopLoad<coop_mat16x16<f16, B>>(&ws[wi{j}], w_ld); }}
      else {{ b{j} = {st}; }}",
                o = j * 16,
                st = staged_b(j)
            )
            .unwrap();
        } else {
            writeln!(w, "      let b{j} = {};", staged_b(j)).unwrap();
        }
    }
    for i in 0..fm {
        for j in 0..fnn {
            writeln!(w, "      c{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c{i}_{j});").unwrap();
        }
    }
    writeln!(
        w,
        "    }}
  }}
  if ((m0 + BM <= p.m) & (n0 + BN <= p.n) & (o_ld % 4u == 0u) & (ob % 4u == 0u)) {{"
    )
    .unwrap();
    for i in 0..fm {
        for j in 0..fnn {
            writeln!(
                w,
                "    let oi{i}_{j} = ob + (m0 + rm + {}u) * o_ld + n0 + cn + {}u;\n    coopStoreT(c{i}_{j}, &os[oi{i}_{j}], o_ld);",
                i * 16,
                j * 16
            )
            .unwrap();
        }
    }
    writeln!(w, "  }} else {{").unwrap();
    for i in 0..fm {
        for j in 0..fnn {
            writeln!(
                w,
                "    let si{i}_{j} = sg * 256u;\n    coopStoreT(c{i}_{j}, &scratch[si{i}_{j}], 16u);
    workgroupBarrier();
    for (var e = lane; e < 256u; e += {COOP_THREADS}u) {{
      let r = m0 + rm + {ri}u + e / 16u; let c = n0 + cn + {cj}u + e % 16u;
      if (r < p.m && c < p.n) {{ os[ob + r * p.o_ld + c] = scratch[sg * 256u + e]; }}
    }}
    workgroupBarrier();",
                ri = i * 16,
                cj = j * 16
            )
            .unwrap();
        }
    }
    writeln!(w, "  }}\n}}").unwrap();
    s
}

/// WGSL of the split-K reduction: partial products of K slices summed into the output.
pub fn reduce_wgsl() -> String {
    let mut s = String::from(
        "struct Params { count: u32, splits: u32, src: u32, dst: u32, stride: u32, row: u32, p0: u32, p1: u32 }\n",
    );
    s.push_str(BINDINGS);
    write!(
        s,
        r#"
@compute @workgroup_size({REDUCE_THREADS}, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
  let i = gid.y * p.row + gid.x;
  if (i >= p.count) {{ return; }}
  var acc = 0.0;
  for (var z = 0u; z < p.splits; z++) {{ acc += os[p.src + z * p.stride + i]; }}
  os[p.dst + i] = acc;
}}
"#
    )
    .unwrap();
    s
}

/// WGSL of the row softmax `softmax(scale · x)`, one workgroup per row. A row whose every
/// entry is −∞ (fully masked) becomes zeros, as on the CPU engine.
pub fn softmax_wgsl() -> String {
    let t = SOFTMAX_THREADS;
    let mut s = String::from(
        "struct Params { rows: u32, cols: u32, scale: f32, grid_x: u32, x_off: u32, o_off: u32, p0: u32, p1: u32 }\n",
    );
    s.push_str(BINDINGS);
    write!(
        s,
        r#"
const T: u32 = {t}u;
// Below this a scaled score counts as masked out: WGSL does not promise IEEE infinities.
const MASKED: f32 = -3.0e38;
var<workgroup> red: array<f32, {t}>;

fn reduce_max(lid: u32, v: f32) -> f32 {{
  red[lid] = v;
  for (var s = T / 2u; s > 0u; s = s / 2u) {{
    workgroupBarrier();
    if (lid < s) {{ red[lid] = max(red[lid], red[lid + s]); }}
  }}
  return workgroupUniformLoad(&red[0]);
}}

fn reduce_sum(lid: u32, v: f32) -> f32 {{
  red[lid] = v;
  for (var s = T / 2u; s > 0u; s = s / 2u) {{
    workgroupBarrier();
    if (lid < s) {{ red[lid] = red[lid] + red[lid + s]; }}
  }}
  return workgroupUniformLoad(&red[0]);
}}

@compute @workgroup_size({t}, 1, 1)
fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{
  let lid = lid3.x;
  let row = wid.y * p.grid_x + wid.x;
  if (row >= p.rows) {{ return; }}
  let xb = p.x_off + row * p.cols;
  let ob = p.o_off + row * p.cols;
  var mx = -3.4e38;
  for (var c = lid; c < p.cols; c += T) {{ mx = max(mx, xs[xb + c] * p.scale); }}
  mx = reduce_max(lid, mx);
  if (mx <= MASKED) {{
    for (var c = lid; c < p.cols; c += T) {{ os[ob + c] = 0.0; }}
    return;
  }}
  var sum = 0.0;
  for (var c = lid; c < p.cols; c += T) {{
    let v = xs[xb + c] * p.scale;
    let e = select(exp(v - mx), 0.0, v <= MASKED);
    os[ob + c] = e;
    sum += e;
  }}
  sum = reduce_sum(lid, sum);
  let inv = 1.0 / sum;
  for (var c = lid; c < p.cols; c += T) {{ os[ob + c] = os[ob + c] * inv; }}
}}
"#
    )
    .unwrap();
    s
}

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
    fn softmax_and_reduce_are_valid_wgsl() {
        validate(&softmax_wgsl());
        validate(&reduce_wgsl());
    }

    #[test]
    fn params_blocks_fit_the_dynamic_offset_stride() {
        assert!(std::mem::size_of::<GemmParams>() as u64 <= PARAMS_BYTES);
        assert!(std::mem::size_of::<SoftmaxParams>() as u64 <= PARAMS_BYTES);
        assert!(std::mem::size_of::<ReduceParams>() as u64 <= PARAMS_BYTES);
    }
}
