//! The ring GEMM of the `dual-lpn` protection: `O = X · W_q mod 2^32`, `X` masked `u32`
//! rows, `W_q` int8 per output column.
//!
//! A weight is stored as its int8 columns packed four to a `u32` word (element `i` of
//! column `o` in byte `i % 4` of word `o·ld + i / 4`, `ld = ⌈d_in / 4⌉`, the last word of a
//! column zero-padded), followed by one word per column: `0x80808080 · Σ_i q[o][i] mod 2^32`,
//! the byte-sliced kernel's correction. WGSL's `u32` multiplication and addition wrap, so
//! both kernels are exact modulo 2^32 whatever the order of the sums.
//!
//! Two ways to multiply ([`RingKernel`]):
//! - `U32`: every weight sign-extended to 32 bits (`unpack4xI8`) and multiplied into a `u32`
//!   accumulator; one 32-bit multiply-add per element pair.
//! - `Dot4`: byte slicing. Each `u32` activation is four bytes `b_j`; with the top bit of
//!   each flipped they are the signed bytes `s_j = b_j − 128`, so
//!   `x·w = Σ_j 2^{8j} Σ_i s_ij·w_i + 0x80808080·Σ_i w_i`. Four consecutive activations are
//!   transposed into four byte planes when a tile is staged, and `dot4I8Packed` multiplies a
//!   plane word by a weight word: four planes, four packed dot products per four elements.
//!
//! Tiles: the register-blocked GEMM (like [`super::gemm_wgsl`]'s, `TM×TN` per thread, `BK`
//! elements of `K` staged a step) for many rows, and a few-row kernel for decode, where a
//! warp-wide group of lanes reads one column's words contiguously and every row is unrolled.

use std::fmt::Write;

/// How the ring GEMM multiplies: see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingKernel {
    /// Sign-extended weights, 32-bit multiply-adds.
    U32,
    /// Byte planes of the activations through `dot4I8Packed`.
    Dot4,
}

impl std::str::FromStr for RingKernel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "u32" => Ok(RingKernel::U32),
            "dot4" => Ok(RingKernel::Dot4),
            other => Err(format!("unknown ring kernel `{other}` (u32, dot4)")),
        }
    }
}

/// One ring pipeline: tiled (`bm×bn` per workgroup, `tm×tn` per thread, `bkw` words of `K`
/// a step) or few-row (`bm` rows unrolled, `bn` columns a workgroup, `lanes` threads a
/// column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingTile {
    pub bm: u32,
    pub bn: u32,
    pub bkw: u32,
    pub tm: u32,
    pub tn: u32,
    /// The few-row kernel; `bkw` is then the lanes per column.
    pub skinny: bool,
}

impl RingTile {
    pub const fn new(bm: u32, bn: u32, bkw: u32, tm: u32, tn: u32) -> Self {
        RingTile { bm, bn, bkw, tm, tn, skinny: false }
    }

    pub const fn skinny(rows: u32, cols: u32, lanes: u32) -> Self {
        RingTile { bm: rows, bn: cols, bkw: lanes, tm: 1, tn: 1, skinny: true }
    }

    pub fn threads(&self) -> u32 {
        if self.skinny { self.bn * self.bkw } else { (self.bm / self.tm) * (self.bn / self.tn) }
    }

    /// Workgroup memory the tile uses.
    pub fn shared_bytes(&self) -> u32 {
        if self.skinny { 4 * self.threads() * self.bm } else { 4 * 4 * self.bkw * (self.bm + self.bn) }
    }

    /// Whether the generator supports this shape (`vec4` register blocks, loads that divide
    /// evenly among the threads).
    pub fn is_valid(&self, kernel: RingKernel) -> bool {
        let t = self.threads();
        if self.skinny {
            return (1..=16).contains(&self.bm) && self.bn > 0 && self.bkw > 0 && t <= 1024;
        }
        let regs = if kernel == RingKernel::Dot4 { 4 * self.tm * self.tn } else { self.tm * self.tn };
        [self.tm, self.tn].iter().all(|&v| v == 4 || v == 8)
            && self.bm.is_multiple_of(4 * self.tm)
            && self.bn.is_multiple_of(4 * self.tn)
            && (self.bm * self.bkw).is_multiple_of(t)
            && (self.bn * self.bkw).is_multiple_of(t)
            && (4 * self.bm * self.bkw).is_multiple_of(t)
            && regs <= 64
            && t <= 1024
    }

    pub fn name(&self) -> String {
        if self.skinny {
            format!("ring-skinny{}x{}/{}", self.bm, self.bn, self.bkw)
        } else {
            format!("ring{}x{}x{}/{}x{}", self.bm, self.bn, 4 * self.bkw, self.tm, self.tn)
        }
    }
}

/// Tiled ring tiles, largest first. The 8×8 register block needs 64 accumulators a thread,
/// which the byte-sliced kernel (four planes) cannot afford: it runs the 4×4 ones.
pub const RING_TILES: [RingTile; 3] =
    [RingTile::new(128, 128, 4, 8, 8), RingTile::new(64, 64, 4, 4, 4), RingTile::new(32, 64, 4, 4, 4)];

/// Few-row tiles by row class: 1, 2, 4, 8 and 16 rows, 8 columns of 32 lanes.
pub const RING_SKINNY_TILES: [RingTile; 5] = [
    RingTile::skinny(1, 8, 32),
    RingTile::skinny(2, 8, 32),
    RingTile::skinny(4, 8, 32),
    RingTile::skinny(8, 8, 32),
    RingTile::skinny(16, 8, 32),
];

/// What one ring pipeline is specialised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingKey {
    pub tile: RingTile,
    pub kernel: RingKernel,
}

/// The uniform block of a ring dispatch (elements and words, offsets in `u32` words).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RingParams {
    /// Rows, columns (`d_out`), elements of `K` (`d_in`) and words per weight column.
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ld: u32,
    /// Offset of `X` in the operands, of the results in the output, of the column
    /// corrections in the weight.
    pub x_off: u32,
    pub o_off: u32,
    pub c_off: u32,
    pub _p0: u32,
}

const HEADER: &str = "struct Params { m: u32, n: u32, k: u32, ld: u32, x_off: u32, o_off: u32, c_off: u32, p0: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xs: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> os: array<u32>;
";

/// WGSL of one ring pipeline.
pub fn ring_wgsl(key: &RingKey) -> String {
    if key.tile.skinny { skinny(key.tile) } else { tiled(key) }
}

/// The register-blocked ring GEMM. Thread `(tx, ty)` owns rows `g·4·WY + 4·ty + i` and
/// columns `h·4·WX + 4·tx + j`, as in the f32 GEMM; `X` is staged transposed (`K`-major),
/// as 32-bit values (`U32`) or as four byte planes per word of `K` (`Dot4`); `W` as
/// sign-extended values (`U32`) or packed words (`Dot4`).
#[allow(clippy::too_many_lines)] // shader source
fn tiled(key: &RingKey) -> String {
    let RingTile { bm, bn, bkw, tm, tn, .. } = key.tile;
    let dot4 = key.kernel == RingKernel::Dot4;
    let (wx, wy) = (bn / tn, bm / tm);
    let t = wx * wy;
    let (gm, gn) = (tm / 4, tn / 4);
    let mut s = String::from(HEADER);
    let w = &mut s;
    // Staged rows of K: BK = 4·BKW values (U32), or BKW words × 4 planes (Dot4): 4·BKW
    // rows of BM (X) either way; W: 4·BKW rows of BN values, or BKW rows of BN words.
    let w_rows = if dot4 { bkw } else { 4 * bkw };
    writeln!(
        w,
        "const BM: u32 = {bm}u; const BN: u32 = {bn}u; const BKW: u32 = {bkw}u; const WX: u32 = {wx}u; const WY: u32 = {wy}u;
var<workgroup> sx: array<vec4<u32>, {}>;
var<workgroup> sw: array<vec4<u32>, {}>;
@compute @workgroup_size({wx}, {wy}, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{
  let tx = lid.x; let ty = lid.y; let tid = ty * WX + tx;
  let m0 = wid.y * BM; let n0 = wid.x * BN;",
        4 * bkw * bm / 4,
        w_rows * bn / 4
    )
    .unwrap();
    let planes = if dot4 { 4 } else { 1 };
    let acc_ty = if dot4 { "vec4<i32>" } else { "vec4<u32>" };
    for j in 0..planes {
        for r in 0..tm {
            for h in 0..gn {
                writeln!(w, "  var c{j}_{r}_{h} = {acc_ty}();").unwrap();
            }
        }
    }
    // Staging, one step: X as words of 4 elements (row r, word kw of the step), W as words.
    let (lx, lw) = (bm * bkw / t, bn * bkw / t);
    for i in 0..lx {
        writeln!(w, "  var rx{i} = vec4<u32>();").unwrap();
    }
    for i in 0..lw {
        writeln!(w, "  var rw{i} = 0u;").unwrap();
    }
    let mut fetch = String::new();
    for i in 0..lx {
        // Element e of the BM×BKW word grid: row e / BKW, word e % BKW; out of range is 0.
        writeln!(
            fetch,
            "    {{ let e = tid + {}u; let r = m0 + e / BKW; let c = 4u * (k0 + e % BKW);
      rx{i} = vec4<u32>();
      if (r < p.m) {{ let b = p.x_off + r * p.k + c;
        if (c + 3u < p.k) {{ rx{i} = vec4<u32>(xs[b], xs[b + 1u], xs[b + 2u], xs[b + 3u]); }}
        else {{ if (c < p.k) {{ rx{i}.x = xs[b]; }} if (c + 1u < p.k) {{ rx{i}.y = xs[b + 1u]; }} if (c + 2u < p.k) {{ rx{i}.z = xs[b + 2u]; }} }} }} }}",
            i * t
        )
        .unwrap();
    }
    for i in 0..lw {
        // Word e of the BN×BKW grid: column e / BKW, word e % BKW (a column's words are
        // contiguous in the weight, so neighbouring threads read neighbouring words).
        writeln!(
            fetch,
            "    {{ let e = tid + {}u; let n = n0 + e / BKW; let kw = k0 + e % BKW;
      rw{i} = 0u; if (n < p.n && kw < p.ld) {{ rw{i} = ws[n * p.ld + kw]; }} }}",
            i * t
        )
        .unwrap();
    }
    let mut stash = String::new();
    for i in 0..lx {
        if dot4 {
            // Four byte planes of the word, top bits flipped (signed bytes s = b − 128);
            // plane j of word kw is staged row 4·kw + j.
            writeln!(
                stash,
                "    {{ let e = tid + {}u; let m = e / BKW; let kw = e % BKW; let v = rx{i} ^ vec4<u32>(0x80808080u);
      for (var j = 0u; j < 4u; j++) {{ let q = (4u * kw + j) * BM + m; sx[q >> 2u][q & 3u] = pack4xU8(v >> vec4<u32>(8u * j)); }} }}",
                i * t
            )
            .unwrap();
        } else {
            writeln!(
                stash,
                "    {{ let e = tid + {}u; let m = e / BKW; let kw = e % BKW;
      for (var j = 0u; j < 4u; j++) {{ let q = (4u * kw + j) * BM + m; sx[q >> 2u][q & 3u] = rx{i}[j]; }} }}",
                i * t
            )
            .unwrap();
        }
    }
    for i in 0..lw {
        if dot4 {
            writeln!(
                stash,
                "    {{ let e = tid + {}u; let n = e / BKW; let q = (e % BKW) * BN + n; sw[q >> 2u][q & 3u] = rw{i}; }}",
                i * t
            )
            .unwrap();
        } else {
            writeln!(
                stash,
                "    {{ let e = tid + {}u; let n = e / BKW; let kw = e % BKW; let v = bitcast<vec4<u32>>(unpack4xI8(rw{i}));
      for (var j = 0u; j < 4u; j++) {{ let q = (4u * kw + j) * BN + n; sw[q >> 2u][q & 3u] = v[j]; }} }}",
                i * t
            )
            .unwrap();
        }
    }
    writeln!(
        w,
        "  var k0 = 0u;\n{fetch}  loop {{\n    if (k0 >= p.ld) {{ break; }}\n{stash}    workgroupBarrier();\n    k0 += BKW;\n    if (k0 < p.ld) {{\n{fetch}    }}"
    )
    .unwrap();
    let comp = ["x", "y", "z", "w"];
    if dot4 {
        writeln!(w, "    for (var kw = 0u; kw < BKW; kw++) {{").unwrap();
        for h in 0..gn {
            writeln!(w, "      let b{h} = sw[kw * (BN / 4u) + {h}u * WX + tx];").unwrap();
        }
        for j in 0..4 {
            for g in 0..gm {
                writeln!(w, "      let a{j}_{g} = sx[(4u * kw + {j}u) * (BM / 4u) + {g}u * WY + ty];").unwrap();
            }
            for g in 0..gm {
                for (i, ci) in comp.iter().enumerate() {
                    let r = g * 4 + i as u32;
                    for h in 0..gn {
                        let dots: Vec<String> =
                            comp.iter().map(|cj| format!("dot4I8Packed(a{j}_{g}.{ci}, b{h}.{cj})")).collect();
                        writeln!(w, "      c{j}_{r}_{h} += vec4<i32>({});", dots.join(", ")).unwrap();
                    }
                }
            }
        }
    } else {
        writeln!(w, "    for (var kk = 0u; kk < 4u * BKW; kk++) {{").unwrap();
        for g in 0..gm {
            writeln!(w, "      let a{g} = sx[kk * (BM / 4u) + {g}u * WY + ty];").unwrap();
        }
        for h in 0..gn {
            writeln!(w, "      let b{h} = sw[kk * (BN / 4u) + {h}u * WX + tx];").unwrap();
        }
        for g in 0..gm {
            for (i, ci) in comp.iter().enumerate() {
                let r = g * 4 + i as u32;
                for h in 0..gn {
                    writeln!(w, "      c0_{r}_{h} += vec4<u32>(a{g}.{ci}) * b{h};").unwrap();
                }
            }
        }
    }
    writeln!(w, "    }}\n    workgroupBarrier();\n  }}").unwrap();
    for g in 0..gm {
        for i in 0..4 {
            let r = g * 4 + i;
            writeln!(w, "  {{ let row = m0 + {}u * WY + 4u * ty + {i}u;\n    if (row < p.m) {{", g * 4).unwrap();
            for h in 0..gn {
                let value = if dot4 {
                    format!(
                        "bitcast<vec4<u32>>(c0_{r}_{h}) + (bitcast<vec4<u32>>(c1_{r}_{h}) << vec4<u32>(8u)) + (bitcast<vec4<u32>>(c2_{r}_{h}) << vec4<u32>(16u)) + (bitcast<vec4<u32>>(c3_{r}_{h}) << vec4<u32>(24u))"
                    )
                } else {
                    format!("c0_{r}_{h}")
                };
                writeln!(
                    w,
                    "      {{ let col = n0 + {}u * WX + 4u * tx; let o = p.o_off + row * p.n + col; let v = {value};
        for (var j = 0u; j < 4u; j++) {{ if (col + j < p.n) {{ os[o + j] = v[j]{}; }} }} }}",
                    h * 4,
                    if dot4 { " + ws[p.c_off + col + j]" } else { "" }
                )
                .unwrap();
            }
            writeln!(w, "    }}\n  }}").unwrap();
        }
    }
    w.push_str("}\n");
    s
}

/// The few-row ring product (decode): `BM` rows unrolled, `BN` columns a workgroup, `L`
/// lanes a column reading its words contiguously (`L` = 32: 128 bytes a step), every weight
/// word sign-extended once and multiplied with all rows; the lanes' sums are reduced in
/// workgroup memory. Rows at or beyond `m` read nothing and are not written.
fn skinny(tile: RingTile) -> String {
    let RingTile { bm, bn, bkw: l, .. } = tile;
    let t = tile.threads();
    let mut s = String::from(HEADER);
    let w = &mut s;
    writeln!(
        w,
        "const BM: u32 = {bm}u; const BN: u32 = {bn}u; const L: u32 = {l}u;
var<workgroup> red: array<u32, {}>;
@compute @workgroup_size({t}, 1, 1)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
  let lane = t % L; let c = t / L; let n = wid.x * BN + c;
  let full = p.k / 4u;",
        t * bm
    )
    .unwrap();
    for r in 0..bm {
        writeln!(w, "  var a{r} = vec4<u32>();").unwrap();
    }
    // Whole words of K: four activations of each row against four weights.
    writeln!(w, "  if (n < p.n) {{\n    for (var kw = lane; kw < full; kw += L) {{").unwrap();
    writeln!(w, "      let wv = bitcast<vec4<u32>>(unpack4xI8(ws[n * p.ld + kw])); let e = 4u * kw;").unwrap();
    for r in 0..bm {
        writeln!(
            w,
            "      if ({r}u < p.m) {{ let b = p.x_off + {r}u * p.k + e; a{r} += vec4<u32>(xs[b], xs[b + 1u], xs[b + 2u], xs[b + 3u]) * wv; }}"
        )
        .unwrap();
    }
    // The ragged last word (d_in not a multiple of 4), by the lane whose turn it is.
    writeln!(
        w,
        "    }}\n    if (full < p.ld && lane == full % L) {{\n      let wv = bitcast<vec4<u32>>(unpack4xI8(ws[n * p.ld + full])); let e = 4u * full;"
    )
    .unwrap();
    for r in 0..bm {
        writeln!(
            w,
            "      if ({r}u < p.m) {{ for (var j = 0u; j < 4u; j++) {{ if (e + j < p.k) {{ a{r}[j] += xs[p.x_off + {r}u * p.k + e + j] * wv[j]; }} }} }}"
        )
        .unwrap();
    }
    writeln!(w, "    }}\n  }}").unwrap();
    for r in 0..bm {
        writeln!(w, "  red[({r}u * BN + c) * L + lane] = a{r}.x + a{r}.y + a{r}.z + a{r}.w;").unwrap();
    }
    writeln!(
        w,
        "  workgroupBarrier();
  for (var q = t; q < BM * BN; q += {t}u) {{
    let r = q / BN; let cq = q % BN; let nq = wid.x * BN + cq;
    if (r < p.m && nq < p.n) {{
      var sum = 0u;
      for (var i = 0u; i < L; i++) {{ sum += red[q * L + i]; }}
      os[p.o_off + r * p.n + nq] = sum;
    }}
  }}
}}"
    )
    .unwrap();
    s
}

/// Packs a weight's int8 columns for the device (see the module docs): `ld` words per
/// column, then one correction word per column. `column(o)` gives column `o`.
pub(crate) fn pack_ring<'a>(d_in: usize, d_out: usize, column: impl Fn(usize) -> &'a [i8]) -> Vec<u32> {
    let ld = d_in.div_ceil(4);
    let mut out = vec![0u32; d_out * ld + d_out];
    for o in 0..d_out {
        let col = column(o);
        let words = &mut out[o * ld..(o + 1) * ld];
        for (i, &q) in col.iter().enumerate() {
            words[i / 4] |= u32::from(q as u8) << (8 * (i % 4));
        }
        let sum = col.iter().fold(0u32, |s, &q| s.wrapping_add(q as i32 as u32));
        out[d_out * ld + o] = sum.wrapping_mul(0x8080_8080);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-sliced identity, on the host: what the `Dot4` kernel computes, word by word.
    #[test]
    fn byte_planes_recombine_to_the_wrapping_product() {
        let x = [0u32, 1, 0x8000_0000, 0xffff_ffff, 0x1234_5678, 0x8080_8080, 0x7f7f_7f7f];
        let w = [-128i8, 127, -1, 0, 5, -77, 100];
        let want = x.iter().zip(&w).fold(0u32, |s, (&a, &b)| s.wrapping_add(a.wrapping_mul(b as i32 as u32)));
        let mut planes = [0i32; 4];
        for (&a, &b) in x.iter().zip(&w) {
            let a = a ^ 0x8080_8080;
            for (j, plane) in planes.iter_mut().enumerate() {
                *plane = plane.wrapping_add(i32::from((a >> (8 * j)) as u8 as i8) * i32::from(b));
            }
        }
        let packed = pack_ring(w.len(), 1, |_| &w[..]);
        let mut got = packed[2];
        for (j, plane) in planes.iter().enumerate() {
            got = got.wrapping_add((*plane as u32) << (8 * j));
        }
        assert_eq!(got, want);
        assert_eq!(packed[0], u32::from_le_bytes([0x80, 0x7f, 0xff, 0x00]));
        assert_eq!(packed[1], u32::from_le_bytes([5, (-77i8) as u8, 100, 0]), "the last word is zero-padded");
    }
}
