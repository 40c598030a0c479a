//! The packed product's AVX2 kernel: tiles of 8 weight rows (one 32-byte vector holds four
//! values of each) against 4 activation rows at a time. Unsigned panels (every format but
//! Q8_0: values below 64) add two `maddubs` results in 16 bits before widening, which
//! cannot saturate (2·2·63·127 < 2¹⁵); the signed panel (Q8_0) applies the sign trick.

use std::arch::x86_64::*;

use super::{
    act::QuantRows,
    packed::{Panel, PanelSpec},
};

pub(crate) const SPEC_UNSIGNED: PanelSpec = PanelSpec { nr: 8, signed: false };
pub(crate) const SPEC_SIGNED: PanelSpec = PanelSpec { nr: 8, signed: true };

/// Rows `j0..j0 + MR` of `x` against the panel's 8 rows.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const MR: usize, const SIGNED: bool, const G: usize>(
    panel: &Panel,
    x: &QuantRows,
    j0: usize,
) -> [__m256; MR] {
    let groups = x.cols / G;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); MR];
    let xq: [*const i8; MR] = std::array::from_fn(|r| x.qs[(j0 + r) * x.cols..].as_ptr());
    let q = panel.q.as_ptr();
    for grp in 0..groups {
        let mut isum = [_mm256_setzero_si256(); MR];
        // SAFETY: the panel holds `groups·G·8` bytes and every activation row `cols`.
        unsafe {
            for t in (0..G / 4).step_by(2) {
                let w0 = _mm256_loadu_si256(q.add((grp * (G / 4) + t) * 32).cast());
                let w1 = _mm256_loadu_si256(q.add((grp * (G / 4) + t + 1) * 32).cast());
                let (a0, a1) = if SIGNED { (_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(w1, w1)) } else { (w0, w1) };
                for r in 0..MR {
                    let xp = xq[r].add(grp * G + 4 * t);
                    let mut x0 = _mm256_set1_epi32(xp.cast::<i32>().read_unaligned());
                    let mut x1 = _mm256_set1_epi32(xp.add(4).cast::<i32>().read_unaligned());
                    if SIGNED {
                        x0 = _mm256_sign_epi8(x0, w0);
                        x1 = _mm256_sign_epi8(x1, w1);
                        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(a0, x0), ones);
                        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(a1, x1), ones);
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
                    } else {
                        let p = _mm256_add_epi16(_mm256_maddubs_epi16(a0, x0), _mm256_maddubs_epi16(a1, x1));
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones));
                    }
                }
            }
            let sv = _mm256_loadu_ps(panel.s.as_ptr().add(grp * 8));
            let mv = _mm256_loadu_ps(panel.mb.as_ptr().add(grp * 8));
            for r in 0..MR {
                let row = (j0 + r) * groups + grp;
                let dx = _mm256_set1_ps(*x.d.get_unchecked(row));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(sv, dx), acc[r]);
                if !SIGNED {
                    acc[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(*x.sums.get_unchecked(row)), acc[r]);
                }
            }
        }
    }
    acc
}

type Tile<const MR: usize> = unsafe fn(&Panel, &QuantRows, usize) -> [__m256; MR];

fn kernels<const MR: usize>(signed: bool, g: usize) -> Tile<MR> {
    match (signed, g) {
        (false, 16) => tile::<MR, false, 16>,
        (false, _) => tile::<MR, false, 32>,
        (true, 16) => tile::<MR, true, 16>,
        (true, _) => tile::<MR, true, 32>,
    }
}

/// `out[j·ldo + o0 + c]` for activation rows `rows` and the panel's first `cols` (≤ 8) rows.
///
/// # Safety
/// The CPU supports AVX2 and FMA; the panel was packed with [`SPEC_UNSIGNED`] or
/// [`SPEC_SIGNED`] (`signed`) for groups of `g` from a weight `x.cols` wide; `x` is quantized
/// in blocks of `g`; the caller owns those columns of `out` for those rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile_rows(
    panel: &Panel,
    signed: bool,
    g: usize,
    x: &QuantRows,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ldo: usize,
    o0: usize,
    cols: usize,
) {
    let (k4, k1) = (kernels::<4>(signed, g), kernels::<1>(signed, g));
    let store = |j: usize, v: __m256| {
        // SAFETY: the caller owns columns `o0..o0 + cols` of row `j`.
        unsafe {
            let dst = out.add(j * ldo + o0);
            if cols == 8 {
                _mm256_storeu_ps(dst, v);
            } else {
                let mut lanes = [0.0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, cols);
            }
        }
    };
    let mut j = rows.start;
    while j + 4 <= rows.end {
        // SAFETY: as promised by the caller.
        let acc = unsafe { k4(panel, x, j) };
        for (r, v) in acc.into_iter().enumerate() {
            store(j + r, v);
        }
        j += 4;
    }
    while j < rows.end {
        // SAFETY: as promised by the caller.
        let [v] = unsafe { k1(panel, x, j) };
        store(j, v);
        j += 1;
    }
}
