//! AVX-512 BW kernels for few-row products (decode) of the formats that dominate a
//! decoder's bytes: the AVX2 kernels' integer scheme (`maddubs` of unsigned weight values
//! with signed activations into 16-bit pairs, `madd` of those with the 16-bit sub-block
//! scales into 32-bit lanes, one float multiply-add a super-block) on vectors twice as
//! wide, so a row costs half the instructions. A 512-bit vector holds two 32-value
//! sub-blocks; the activation halves that meet them are gathered by one insert.

use std::arch::x86_64::*;

use super::{
    act::ActRow,
    stream_avx2::{RowKernel, bsum_pairs, f16_at, hsum128, k4_scales_mins},
};

/// The Q4_K kernels for 1..=4 activation rows at a time.
pub(super) fn q4_k() -> (RowKernel<1>, RowKernel<2>, RowKernel<3>, RowKernel<4>) {
    (q4_k_rows::<1>, q4_k_rows::<2>, q4_k_rows::<3>, q4_k_rows::<4>)
}

/// Sum of sixteen lanes.
#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    unsafe { _mm512_reduce_add_ps(v) }
}

/// Activation values `a..a + 32` and `b..b + 32` of the row at `x` in one vector.
#[inline(always)]
unsafe fn halves(x: *const i8, a: usize, b: usize) -> __m512i {
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(x.add(a).cast())),
            _mm256_loadu_si256(x.add(b).cast()),
        )
    }
}

/// A Q4_K row (`nb` super-blocks at `w`) against `M` activation rows.
///
/// Super-block layout: `d`, `dmin` (f16), twelve bytes of 6-bit scales and mins, then 128
/// bytes whose 32-byte group `j` holds sub-block `2j` in its low nibbles and `2j + 1` in its
/// high ones. The first 64 bytes' low nibbles are sub-blocks 0 and 2, their high nibbles 1
/// and 3; the last 64 bytes' are 4 and 6, 5 and 7.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q4_k_rows<const M: usize>(w: *const u8, nb: usize, acts: &[ActRow<'_>]) -> [f32; M] {
    let rows: [ActRow<'_>; M] = std::array::from_fn(|r| acts[r]);
    let mut acc = [_mm512_setzero_ps(); M];
    let mut bias = [_mm_setzero_ps(); M];
    // Which scale each 16-bit lane of a product gets: sub-block `a` in the low half, `b`
    // in the high half, for the vectors (low 0/2, high 1/3, low 4/6, high 5/7).
    let pick = |a: i16, b: i16| _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b));
    let idx = [pick(0, 2), pick(1, 3), pick(4, 6), pick(5, 7)];
    let m4 = _mm512_set1_epi8(0x0F);
    for i in 0..nb {
        // SAFETY: super-block `i` of the row (144 bytes) and of every activation row (256
        // values, one scale, sixteen sums) exist (the caller's shapes).
        unsafe {
            let p = w.add(i * 144);
            let (d, dmin) = (f16_at(p), f16_at(p.add(2)));
            let sm = k4_scales_mins(p.add(4));
            let sm512 = _mm512_castsi256_si512(sm);
            let sc: [__m512i; 4] = std::array::from_fn(|v| _mm512_permutexvar_epi16(idx[v], sm512));
            let mins = _mm256_extracti128_si256::<1>(sm);
            let q0 = _mm512_loadu_si512(p.add(16).cast());
            let q1 = _mm512_loadu_si512(p.add(80).cast());
            let vals = [
                _mm512_and_si512(q0, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m4),
                _mm512_and_si512(q1, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4),
            ];
            // Activation offsets of each vector's two sub-blocks.
            const AT: [(usize, usize); 4] = [(0, 64), (32, 96), (128, 192), (160, 224)];
            for r in 0..M {
                let x = rows[r].qs.as_ptr().add(256 * i);
                let mut sumi = _mm512_setzero_si512();
                for v in 0..4 {
                    let xv = halves(x, AT[v].0, AT[v].1);
                    sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(vals[v], xv), sc[v]));
                }
                let dx = *rows[r].d.get_unchecked(i);
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * dx), _mm512_cvtepi32_ps(sumi), acc[r]);
                let m = _mm_madd_epi16(mins, bsum_pairs(rows[r].bsums.as_ptr().add(16 * i)));
                bias[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * dx), _mm_cvtepi32_ps(m), bias[r]);
            }
        }
    }
    let mut out = [0.0f32; M];
    for r in 0..M {
        // SAFETY: AVX-512 F and SSE3 are enabled here.
        out[r] = unsafe { hsum512(acc[r]) - hsum128(bias[r]) };
    }
    out
}
