//! The GEMM on Vulkan cooperative matrices (tensor cores): f16 operands, f32 accumulation.

use std::fmt::Write;

use tensor::WeightLayout;

use super::{BINDINGS, COOP_PAD, COOP_THREADS, GemmKey, Tile, WeightType};

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
#[allow(clippy::too_many_lines)] // shader source
pub(super) fn coop_wgsl(key: &GemmKey) -> String {
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
