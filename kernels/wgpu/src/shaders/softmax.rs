//! The row softmax of attention scores, fully masked rows included.

use std::fmt::Write;

use super::{BINDINGS, SOFTMAX_THREADS};

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
