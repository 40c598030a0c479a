//! The few-row GEMM for decode: a handful of rows of `X` against a large weight, streamed
//! once.

use std::fmt::Write;

use tensor::WeightLayout;

use super::{GemmKey, Tile, WeightType};

/// WGSL of the few-row product (decode: a handful of rows against a large weight). The
/// weight is streamed once: each thread owns `CPT` columns and every `L`-th vector of `K`
/// (the `L` threads of a column group read consecutive 16-byte words of a checkpoint-layout
/// row: 4 f32 or 8 16-bit values), issues the loads of `U` such words per column before
/// using any (enough bytes in flight to keep HBM busy with few threads), multiplies them
/// with all `BM` rows of `X` (read once per element, shared by its columns), and the
/// partial sums are reduced over the group in workgroup memory. Unaligned shapes and the
/// `InOut` layout take a scalar loop. Rows beyond `m` read as 0; products and sums are f32.
#[allow(clippy::too_many_lines)] // shader source
pub(super) fn skinny_wgsl(key: &GemmKey) -> String {
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
