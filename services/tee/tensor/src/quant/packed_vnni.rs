//! The packed product's AVX-512 VNNI kernel: tiles of 16 weight rows (one 64-byte vector
//! holds four values of each) against 8 activation rows at a time. `vpdpbusd` multiplies
//! the unsigned panel bytes with four broadcast activation bytes and adds the four products
//! into each row's 32-bit lane in one instruction, without the 16-bit step that can
//! saturate, so every format (Q8_0 too) uses the unsigned panel.

use std::arch::x86_64::*;

use super::{
    act::QuantRows,
    packed::{Panel, PanelSpec},
};

pub(crate) const SPEC: PanelSpec = PanelSpec { nr: 16, signed: false };

/// Rows `j0..j0 + MR` of `x` against the panel's 16 rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const MR: usize, const G: usize>(panel: &Panel, x: &QuantRows, j0: usize) -> [__m512; MR] {
    let groups = x.cols / G;
    let mut acc = [_mm512_setzero_ps(); MR];
    let xq: [*const i8; MR] = std::array::from_fn(|r| x.qs[(j0 + r) * x.cols..].as_ptr());
    let q = panel.q.as_ptr();
    for grp in 0..groups {
        let mut isum = [_mm512_setzero_si512(); MR];
        // SAFETY: the panel holds `groups·G·16` bytes and every activation row `cols`.
        unsafe {
            for t in 0..G / 4 {
                let w = _mm512_loadu_si512(q.add((grp * (G / 4) + t) * 64).cast());
                for r in 0..MR {
                    let xv = _mm512_set1_epi32(xq[r].add(grp * G + 4 * t).cast::<i32>().read_unaligned());
                    isum[r] = _mm512_dpbusd_epi32(isum[r], w, xv);
                }
            }
            let sv = _mm512_loadu_ps(panel.s.as_ptr().add(grp * 16));
            let mv = _mm512_loadu_ps(panel.mb.as_ptr().add(grp * 16));
            for r in 0..MR {
                let row = (j0 + r) * groups + grp;
                let dx = _mm512_set1_ps(*x.d.get_unchecked(row));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(sv, dx), acc[r]);
                acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(*x.sums.get_unchecked(row)), acc[r]);
            }
        }
    }
    acc
}

type Tile<const MR: usize> = unsafe fn(&Panel, &QuantRows, usize) -> [__m512; MR];

fn kernels<const MR: usize>(g: usize) -> Tile<MR> {
    if g == 16 { tile::<MR, 16> } else { tile::<MR, 32> }
}

/// `out[j·ldo + o0 + c]` for activation rows `rows` and the panel's first `cols` (≤ 16) rows.
///
/// # Safety
/// The CPU supports AVX-512 F, BW and VNNI; the panel was packed with [`SPEC`] for groups of
/// `g` from a weight `x.cols` wide; `x` is quantized in groups of `g`; the caller owns those
/// columns of `out` for those rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn tile_rows(
    panel: &Panel,
    g: usize,
    x: &QuantRows,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ldo: usize,
    o0: usize,
    cols: usize,
) {
    let (k8, k1) = (kernels::<8>(g), kernels::<1>(g));
    let mask: __mmask16 = if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 };
    // SAFETY (stores): the caller owns columns `o0..o0 + cols` of these rows; the mask
    // keeps the store inside them.
    let store = |j: usize, v: __m512| unsafe { _mm512_mask_storeu_ps(out.add(j * ldo + o0), mask, v) };
    let mut j = rows.start;
    while j + 8 <= rows.end {
        // SAFETY: as promised by the caller.
        let acc = unsafe { k8(panel, x, j) };
        for (r, v) in acc.into_iter().enumerate() {
            store(j + r, v);
        }
        j += 8;
    }
    while j < rows.end {
        // SAFETY: as promised by the caller.
        let [v] = unsafe { k1(panel, x, j) };
        store(j, v);
        j += 1;
    }
}
