//! The register-blocked FMA GEMM (see the module docs of [`super`]), and the choice of
//! kernel family by tile: cooperative and few-row tiles get their own generators.

use std::fmt::Write;

use tensor::WeightLayout;

use super::{BINDINGS, GemmKey, Tile, WeightType, coop::coop_wgsl, skinny::skinny_wgsl};

/// WGSL of the GEMM `O[b] = X[b] · W[b]` for one key.
#[allow(clippy::too_many_lines)] // shader source
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
