//! Products of many activation rows (prefill, embedding batches): each tile of `NR` weight
//! rows is unpacked once from its blocks into a panel of unsigned bytes, interleaved so that
//! one vector holds four consecutive values of each of the `NR` rows, and multiplied with
//! every activation row while it stays in L1. A broadcast of four activation bytes then
//! meets `NR` rows at once (`maddubs`, or `vpdpbusd` with VNNI), and the scales are applied
//! once per group of 16 or 32 values with one float multiply-add for all `NR` rows. Unpacking
//! costs one pass over the tile per task, against a product over all the task's rows.
//!
//! Every format goes through the same panel: values `q` as bytes, a scale `s` and an offset
//! `mb` per row and group (value = `s·q + mb`, see `portable::unpack_block`). The offset's
//! share is `mb · Σx` per group, from the activation block sums.

use super::{Isa, QuantFormat, QuantMatrix, act::QuantRows, portable};

/// A tile's panel: `q` interleaved as `[quad][row][4 bytes]` (a group's quads are
/// consecutive), `s` and `mb` as `[group][row]`; `row` is scratch for one row's values.
#[derive(Default)]
pub(crate) struct Panel {
    pub q: Vec<u8>,
    pub s: Vec<f32>,
    pub mb: Vec<f32>,
    row: Vec<u8>,
}

/// How a kernel set wants its panels.
#[derive(Clone, Copy)]
pub(crate) struct PanelSpec {
    /// Rows per tile.
    pub nr: usize,
    /// Signed values (`q ^ 0x80`, offset 0) instead of unsigned ones: AVX2's `maddubs`
    /// would saturate on Q8_0's unsigned bytes (up to 255).
    pub signed: bool,
}

/// Unpacks weight rows `o0..o0 + spec.nr` (rows past the weight's end are zero) into
/// `panel`, the values through `isa`'s unpacking.
pub(crate) fn pack(w: &QuantMatrix, o0: usize, spec: PanelSpec, isa: Isa, panel: &mut Panel) {
    let format = w.format();
    let g = portable::group(format);
    let (be, bb) = format.geometry();
    let (cols, groups, nr) = (w.cols(), w.cols() / g, spec.nr);
    panel.q.resize(cols * nr, 0);
    panel.s.resize(groups * nr, 0.0);
    panel.mb.resize(groups * nr, 0.0);
    panel.row.resize(cols, 0);
    let rb = w.row_bytes();
    let (mut s, mut mb) = ([0f32; 16], [0f32; 16]);
    let flip = if spec.signed { 0x8080_8080u32 } else { 0 };
    for r in 0..nr {
        if o0 + r >= w.rows() {
            // Padding rows: zero values and scales, so they add nothing.
            for t in 0..cols / 4 {
                panel.q[(t * nr + r) * 4..(t * nr + r) * 4 + 4].fill(0);
            }
            (0..groups).for_each(|grp| (panel.s[grp * nr + r], panel.mb[grp * nr + r]) = (0.0, 0.0));
            continue;
        }
        let row = &w.bytes()[(o0 + r) * rb..(o0 + r + 1) * rb];
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` and `Avx512Vnni` are only chosen where the CPU runs AVX2; `row` is
            // whole blocks and `panel.row` as long as their values.
            Isa::Avx2 | Isa::Avx512Vnni => unsafe { super::stream_avx2::row_values(format, row, &mut panel.row) },
            _ => row
                .chunks_exact(bb)
                .enumerate()
                .for_each(|(bi, blk)| portable::block_values(format, blk, &mut panel.row[bi * be..(bi + 1) * be])),
        }
        for (bi, blk) in row.chunks_exact(bb).enumerate() {
            portable::block_scales(format, blk, &mut s, &mut mb);
            for gi in 0..be / g {
                let grp = bi * (be / g) + gi;
                panel.s[grp * nr + r] = s[gi];
                panel.mb[grp * nr + r] = if spec.signed { 0.0 } else { mb[gi] };
            }
        }
        // Quad t of the row (values 4t..4t+4) goes to slot t·nr + r.
        for (t, quad) in panel.row.chunks_exact(4).enumerate() {
            let v = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]) ^ flip;
            panel.q[(t * nr + r) * 4..(t * nr + r) * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Whether `format`'s values fit the signed panel exactly: only Q8_0 needs it (its
/// unsigned values reach 255); every other format's values are below 64.
pub(crate) fn needs_signed(format: QuantFormat) -> bool {
    format == QuantFormat::Q8_0
}

/// The portable kernel over a panel (what the SIMD kernels compute, element by element):
/// `out[(j0 + r)·ldo + o0 + c]` for `r < rows`, `c < cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile_portable(
    panel: &Panel,
    spec: PanelSpec,
    g: usize,
    x: &QuantRows,
    j0: usize,
    rows: usize,
    out: *mut f32,
    ldo: usize,
    o0: usize,
    cols: usize,
) {
    let groups = x.cols / g;
    let nr = spec.nr;
    for r in 0..rows {
        let xr = x.row(j0 + r);
        for c in 0..cols {
            let mut acc = 0.0f32;
            for grp in 0..groups {
                let mut idot = 0i32;
                for t in 0..g / 4 {
                    for k in 0..4 {
                        let q = panel.q[((grp * (g / 4) + t) * nr + c) * 4 + k];
                        let qv = if spec.signed { q as i8 as i32 } else { q as i32 };
                        idot += qv * xr.qs[grp * g + 4 * t + k] as i32;
                    }
                }
                acc += idot as f32 * (panel.s[grp * nr + c] * xr.d[grp]) + panel.mb[grp * nr + c] * xr.sums[grp];
            }
            // SAFETY: the caller owns these rows' columns `o0..o0 + cols` of `out`.
            unsafe { *out.add((j0 + r) * ldo + o0 + c) = acc };
        }
    }
}
