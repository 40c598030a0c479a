//! The split-K reduction: the partial products of a split GEMM's K slices summed.

use std::fmt::Write;

use super::{BINDINGS, REDUCE_THREADS};

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
