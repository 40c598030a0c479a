//! AVX2 kernels for few-row products (decode): each weight row is read once, in its
//! block format, and multiplied with up to four quantized activation rows while it is in
//! registers. The integer part follows llama.cpp's x86 kernels: `maddubs` multiplies the
//! unsigned weight values with the signed activations into 16-bit pairs (which cannot
//! saturate: weight values are below 64, or signed and handled by the sign trick),
//! `madd` widens them into 32-bit lanes, one float multiply-add per block (32 values) or
//! super-block (256, the K-quants) applies both scales. Offsets and mins are applied once per
//! block from the activations' block sums.

use std::arch::x86_64::*;

use super::{
    QuantFormat,
    act::{ActRow, QuantRows},
};

/// Horizontal sum of eight lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// Horizontal sum of four lanes.
#[inline(always)]
pub(super) unsafe fn hsum128(s: __m128) -> f32 {
    unsafe {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// The f16 at `p` as f32.
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    unsafe {
        let bits = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// The 32 nibbles of 16 bytes: low nibbles are elements 0..16, high nibbles 16..32.
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    unsafe {
        let q = _mm_loadu_si128(p.cast());
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(q), q), _mm256_set1_epi8(0x0F))
    }
}

/// `0x10` in byte j where bit j of `qh` is set (the fifth bits of a Q5 block).
#[inline(always)]
unsafe fn fifth_bits(qh: u32) -> __m256i {
    unsafe {
        let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10))
    }
}

/// Σ of `u·x` in four-value groups, as eight 32-bit lanes (`u` unsigned, below 128).
#[inline(always)]
unsafe fn dot_u8(u: __m256i, x: __m256i) -> __m256i {
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)) }
}

/// A 32-value block format: its size, where its f16 scale (at byte 0) and min sit, and its
/// values as unsigned bytes (or signed, for Q8_0). A value is `d·(q + OFFSET)`, plus the
/// block's min where the format has one, so a block contributes
/// `d·dx·Σq·x + (OFFSET·d or min)·Σ(dx·x)`: the second term comes from the activations'
/// block sums, eight blocks at a time.
trait Block32 {
    const BYTES: usize;
    const SIGNED: bool = false;
    /// Byte offset of the f16 min (Q4_1, Q5_1).
    const MIN_AT: Option<usize> = None;
    const OFFSET: f32 = 0.0;
    unsafe fn values(p: *const u8) -> __m256i;
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

impl Block32 for Q4_0 {
    const BYTES: usize = 18;
    const OFFSET: f32 = -8.0;
    #[inline(always)]
    unsafe fn values(p: *const u8) -> __m256i {
        unsafe { nibbles16(p.add(2)) }
    }
}

impl Block32 for Q4_1 {
    const BYTES: usize = 20;
    const MIN_AT: Option<usize> = Some(2);
    #[inline(always)]
    unsafe fn values(p: *const u8) -> __m256i {
        unsafe { nibbles16(p.add(4)) }
    }
}

impl Block32 for Q5_0 {
    const BYTES: usize = 22;
    const OFFSET: f32 = -16.0;
    #[inline(always)]
    unsafe fn values(p: *const u8) -> __m256i {
        unsafe { _mm256_or_si256(nibbles16(p.add(6)), fifth_bits(p.add(2).cast::<u32>().read_unaligned())) }
    }
}

impl Block32 for Q5_1 {
    const BYTES: usize = 24;
    const MIN_AT: Option<usize> = Some(2);
    #[inline(always)]
    unsafe fn values(p: *const u8) -> __m256i {
        unsafe { _mm256_or_si256(nibbles16(p.add(8)), fifth_bits(p.add(4).cast::<u32>().read_unaligned())) }
    }
}

impl Block32 for Q8_0 {
    const BYTES: usize = 34;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn values(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p.add(2).cast()) }
    }
}

/// The f16 at byte `at` of blocks `b0..b0 + 8` as eight f32.
#[inline(always)]
unsafe fn f16x8<F: Block32>(w: *const u8, b0: usize, at: usize) -> __m256 {
    unsafe {
        let h = |k: usize| w.add((b0 + k) * F::BYTES + at).cast::<i16>().read_unaligned();
        _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)))
    }
}

/// One weight row (`nb` blocks at `w`) against activation rows `j0..j0 + M` (blocks of 32).
/// Blocks go in groups of eight: their scales are converted and multiplied with the
/// activations' in one vector each, and the offsets' share is one multiply-add a group.
/// The last `nb % 8` blocks go one by one. (Nothing in the loops calls out: a call would
/// spill the accumulators.)
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block32<F: Block32, const M: usize>(w: *const u8, nb: usize, acts: &[ActRow<'_>]) -> [f32; M] {
    let rows: [ActRow<'_>; M] = std::array::from_fn(|r| acts[r]);
    // With one or two rows, two accumulator sets alternate by block so that a row's
    // multiply-adds do not wait on each other; more rows give that overlap already, and a
    // second set would no longer fit the registers.
    let mut acc = [[_mm256_setzero_ps(); M]; 2];
    let split = M <= 2;
    let mut bias = [_mm256_setzero_ps(); M];
    let mut tail = [0.0f32; M];
    let full = nb / 8 * 8;
    // SAFETY: the caller checked that the row holds `nb` blocks and that each activation
    // row holds `nb` blocks of 32 values (and as many scales and sums).
    unsafe {
        let dot = |q: __m256i, b: usize, r: usize| -> __m256 {
            let qa = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
            let mut xv = _mm256_loadu_si256(rows[r].qs.as_ptr().add(32 * b).cast());
            if F::SIGNED {
                xv = _mm256_sign_epi8(xv, q);
            }
            _mm256_cvtepi32_ps(dot_u8(qa, xv))
        };
        for b0 in (0..full).step_by(8) {
            let dw = f16x8::<F>(w, b0, 0);
            let c = match F::MIN_AT {
                Some(at) => f16x8::<F>(w, b0, at),
                None => _mm256_mul_ps(dw, _mm256_set1_ps(F::OFFSET)),
            };
            let mut sc = [_mm256_setzero_ps(); M];
            for r in 0..M {
                sc[r] = _mm256_mul_ps(dw, _mm256_loadu_ps(rows[r].d.as_ptr().add(b0)));
                if !F::SIGNED {
                    bias[r] = _mm256_fmadd_ps(c, _mm256_loadu_ps(rows[r].sums.as_ptr().add(b0)), bias[r]);
                }
            }
            for k in 0..8 {
                let q = F::values(w.add((b0 + k) * F::BYTES));
                let idx = _mm256_set1_epi32(k as i32);
                for r in 0..M {
                    let a = if split { k & 1 } else { 0 };
                    let s = _mm256_permutevar8x32_ps(sc[r], idx);
                    acc[a][r] = _mm256_fmadd_ps(dot(q, b0 + k, r), s, acc[a][r]);
                }
            }
        }
        for b in full..nb {
            let p = w.add(b * F::BYTES);
            let d = f16_at(p);
            let c = match F::MIN_AT {
                Some(at) => f16_at(p.add(at)),
                None => F::OFFSET * d,
            };
            let q = F::values(p);
            for r in 0..M {
                let s = _mm256_set1_ps(d * *rows[r].d.get_unchecked(b));
                acc[0][r] = _mm256_fmadd_ps(dot(q, b, r), s, acc[0][r]);
                if !F::SIGNED {
                    tail[r] += c * *rows[r].sums.get_unchecked(b);
                }
            }
        }
    }
    let mut out = [0.0f32; M];
    for r in 0..M {
        out[r] = unsafe { hsum(_mm256_add_ps(acc[0][r], acc[1][r])) + hsum(bias[r]) } + tail[r];
    }
    out
}

/// Q4_K's eight 6-bit scales (lanes 0..8) and mins (lanes 8..16) as 16-bit lanes, unpacked
/// from the 12 bytes at `p` with a few 32-bit masks and shifts instead of byte by byte
/// (ggml's `utmp` unpacking; [`super::format::scale_min_k4`] is the reference).
#[inline(always)]
pub(super) unsafe fn k4_scales_mins(p: *const u8) -> __m256i {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let mut u = [0u32; 4];
    // SAFETY: the caller's super-block holds 12 scale bytes at `p`.
    unsafe {
        std::ptr::copy_nonoverlapping(p, u.as_mut_ptr().cast::<u8>(), 12);
    }
    let mins_lo = u[1] & LOW6;
    let mins_hi = ((u[2] >> 4) & LOW4) | (((u[1] >> 6) & LOW2) << 4);
    let scales_hi = (u[2] & LOW4) | (((u[0] >> 6) & LOW2) << 4);
    let scales_lo = u[0] & LOW6;
    // SAFETY: AVX2 is enabled in the calling kernels.
    unsafe { _mm256_cvtepu8_epi16(_mm_set_epi32(mins_hi as i32, mins_lo as i32, scales_hi as i32, scales_lo as i32)) }
}

/// The 16 sub-block sums of a super-block's activations, added in pairs (the 32-value
/// sub-blocks of Q4_K/Q5_K): eight 16-bit lanes (each at most 32·127, no overflow).
#[inline(always)]
pub(super) unsafe fn bsum_pairs(bsums: *const i16) -> __m128i {
    unsafe { _mm_hadd_epi16(_mm_loadu_si128(bsums.cast()), _mm_loadu_si128(bsums.add(8).cast())) }
}

/// Q4_K (`HIGH = false`) or Q5_K (`HIGH = true`) row against activation rows in blocks of 256.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45_k<const HIGH: bool, const M: usize>(w: *const u8, nb: usize, acts: &[ActRow<'_>]) -> [f32; M] {
    let bytes = if HIGH { 176 } else { 144 };
    let rows: [ActRow<'_>; M] = std::array::from_fn(|r| acts[r]);
    let mut acc = [_mm256_setzero_ps(); M];
    let mut bias = [_mm_setzero_ps(); M];
    for i in 0..nb {
        // SAFETY: as in `block32`, with super-blocks of 256.
        unsafe {
            let p = w.add(i * bytes);
            let (d, dmin) = (f16_at(p), f16_at(p.add(2)));
            let sm = k4_scales_mins(p.add(4));
            let mut sc = [0i16; 16];
            _mm256_storeu_si256(sc.as_mut_ptr().cast(), sm);
            let mins = _mm256_extracti128_si256::<1>(sm);
            let mut sumi = [_mm256_setzero_si256(); M];
            for j in 0..4 {
                let (lo, hi) = q45k_values::<HIGH>(p, j);
                let (sl, sh) = (_mm256_set1_epi16(sc[2 * j]), _mm256_set1_epi16(sc[2 * j + 1]));
                for r in 0..M {
                    let xp = rows[r].qs.as_ptr().add(256 * i + 64 * j);
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(xp.cast())), sl);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256(xp.add(32).cast())), sh);
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pl, ph));
                }
            }
            for r in 0..M {
                let dx = *rows[r].d.get_unchecked(i);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                let m = _mm_madd_epi16(mins, bsum_pairs(rows[r].bsums.as_ptr().add(16 * i)));
                bias[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * dx), _mm_cvtepi32_ps(m), bias[r]);
            }
        }
    }
    let mut out = [0.0f32; M];
    for r in 0..M {
        out[r] = unsafe { hsum(acc[r]) - hsum128(bias[r]) };
    }
    out
}

/// Q6_K row against activation rows in blocks of 256.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k<const M: usize>(w: *const u8, nb: usize, acts: &[ActRow<'_>]) -> [f32; M] {
    let rows: [ActRow<'_>; M] = std::array::from_fn(|r| acts[r]);
    let mut acc = [_mm256_setzero_ps(); M];
    let mut bias = [_mm256_setzero_ps(); M];
    for i in 0..nb {
        // SAFETY: as in `block32`, with super-blocks of 256.
        unsafe {
            let p = w.add(i * 210);
            let d = f16_at(p.add(208));
            let sc: [i8; 16] = p.add(192).cast::<[i8; 16]>().read_unaligned();
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
            let mut sumi = [_mm256_setzero_si256(); M];
            for h in 0..2 {
                let q = q6k_values(p, h);
                for (t, qt) in q.iter().enumerate() {
                    let k = 8 * h + 2 * t;
                    let sv = _mm256_set_m128i(_mm_set1_epi16(sc[k + 1] as i16), _mm_set1_epi16(sc[k] as i16));
                    for r in 0..M {
                        let xv = _mm256_loadu_si256(rows[r].qs.as_ptr().add(256 * i + 128 * h + 32 * t).cast());
                        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(*qt, xv), sv));
                    }
                }
            }
            for r in 0..M {
                let dx = *rows[r].d.get_unchecked(i);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                let bs = _mm256_loadu_si256(rows[r].bsums.as_ptr().add(16 * i).cast());
                let off = _mm256_cvtepi32_ps(_mm256_madd_epi16(sc16, bs));
                bias[r] = _mm256_fmadd_ps(_mm256_set1_ps(32.0 * d * dx), off, bias[r]);
            }
        }
    }
    let mut out = [0.0f32; M];
    for r in 0..M {
        out[r] = unsafe { hsum(_mm256_sub_ps(acc[r], bias[r])) };
    }
    out
}

/// Sub-blocks `2j` and `2j + 1` of a Q4_K (`HIGH = false`) or Q5_K super-block at `p`, as
/// unsigned bytes.
#[inline(always)]
unsafe fn q45k_values<const HIGH: bool>(p: *const u8, j: usize) -> (__m256i, __m256i) {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let q4 = _mm256_loadu_si256(p.add(if HIGH { 48 } else { 16 } + 32 * j).cast());
        let mut lo = _mm256_and_si256(q4, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
        if HIGH {
            let hbits = _mm256_loadu_si256(p.add(16).cast());
            let (ml, mh) = (_mm256_set1_epi8((1u8 << (2 * j)) as i8), _mm256_set1_epi8((2u8 << (2 * j)) as i8));
            let b5 = _mm256_set1_epi8(0x10);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, ml), ml), b5));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, mh), mh), b5));
        }
        (lo, hi)
    }
}

/// Half `h` (values `128h..128h + 128`) of a Q6_K super-block at `p`, as four vectors of
/// unsigned 6-bit values.
#[inline(always)]
unsafe fn q6k_values(p: *const u8, h: usize) -> [__m256i; 4] {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let ql0 = _mm256_loadu_si256(p.add(64 * h).cast());
        let ql1 = _mm256_loadu_si256(p.add(64 * h + 32).cast());
        let qh = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
        [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0xC0u8 as i8))),
            ),
        ]
    }
}

/// Every value of a row of `format` blocks as unsigned bytes, as `portable::block_values`
/// writes them (Q8_0's signed values shifted by 128), into `q` (the row's length).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `row` is whole blocks and `q` as long as their values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn row_values(format: QuantFormat, row: &[u8], q: &mut [u8]) {
    let (be, bb) = format.geometry();
    let mut put = |at: usize, v: __m256i| {
        // SAFETY: `at + 32 <= q.len()`: each block writes its own `be` values.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr().add(at).cast(), v) }
    };
    for (bi, blk) in row.chunks_exact(bb).enumerate() {
        let p = blk.as_ptr();
        let at = bi * be;
        // SAFETY: `blk` is one whole block of `format`.
        unsafe {
            match format {
                QuantFormat::Q4_0 => put(at, Q4_0::values(p)),
                QuantFormat::Q4_1 => put(at, Q4_1::values(p)),
                QuantFormat::Q5_0 => put(at, Q5_0::values(p)),
                QuantFormat::Q5_1 => put(at, Q5_1::values(p)),
                QuantFormat::Q8_0 => put(at, _mm256_xor_si256(Q8_0::values(p), _mm256_set1_epi8(0x80u8 as i8))),
                QuantFormat::Q4_K | QuantFormat::Q5_K => {
                    for j in 0..4 {
                        let (lo, hi) = if format == QuantFormat::Q5_K {
                            q45k_values::<true>(p, j)
                        } else {
                            q45k_values::<false>(p, j)
                        };
                        put(at + 64 * j, lo);
                        put(at + 64 * j + 32, hi);
                    }
                }
                QuantFormat::Q6_K => {
                    for h in 0..2 {
                        for (t, v) in q6k_values(p, h).into_iter().enumerate() {
                            put(at + 128 * h + 32 * t, v);
                        }
                    }
                }
                other => unreachable!("{other} has no kernels"),
            }
        }
    }
}

/// One weight row against `M` activation rows starting at `j0`.
pub(super) type RowKernel<const M: usize> = unsafe fn(*const u8, usize, &[ActRow<'_>]) -> [f32; M];

/// The kernels of `format` for 1..=4 activation rows at a time.
#[inline(always)]
fn kernels(format: QuantFormat) -> (RowKernel<1>, RowKernel<2>, RowKernel<3>, RowKernel<4>) {
    macro_rules! set {
        ($f:ident) => {
            ($f::<1>, $f::<2>, $f::<3>, $f::<4>)
        };
        ($f:ident, $t:ty) => {
            ($f::<$t, 1>, $f::<$t, 2>, $f::<$t, 3>, $f::<$t, 4>)
        };
        ($f:ident, const $c:expr) => {
            ($f::<$c, 1>, $f::<$c, 2>, $f::<$c, 3>, $f::<$c, 4>)
        };
    }
    match format {
        QuantFormat::Q4_0 => set!(block32, Q4_0),
        QuantFormat::Q4_1 => set!(block32, Q4_1),
        QuantFormat::Q5_0 => set!(block32, Q5_0),
        QuantFormat::Q5_1 => set!(block32, Q5_1),
        QuantFormat::Q8_0 => set!(block32, Q8_0),
        QuantFormat::Q4_K => set!(q45_k, const false),
        QuantFormat::Q5_K => set!(q45_k, const true),
        QuantFormat::Q6_K => set!(q6_k),
        other => unreachable!("no streaming kernel for {other}"),
    }
}

/// `out[j·ldo + o] = x_j · W_o` for the weight rows `o` in `rows` and every activation row.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w` holds whole rows of `row_bytes` bytes for every
/// `o` in `rows`, `x` is quantized in the block size `format` streams with, and `out` is
/// valid for `x.rows()` rows of `ldo` values with no other writer of these columns; with
/// `wide` the CPU also runs AVX-512 F and BW (formats with a 512-bit kernel use it).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows(
    wide: bool,
    format: QuantFormat,
    w: &[u8],
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    x: &QuantRows,
    out: *mut f32,
    ldo: usize,
) {
    let nb = x.cols / format.block_elements();
    let (k1, k2, k3, k4) =
        if wide && format == QuantFormat::Q4_K { super::stream_avx512::q4_k() } else { kernels(format) };
    let m = x.rows;
    // Every activation row's slices, made once for all the weight rows.
    let acts: Vec<ActRow<'_>> = (0..m).map(|j| x.row(j)).collect();
    for o in rows {
        // SAFETY: the row lies inside `w` (caller); columns `o` of `out` are ours.
        unsafe {
            let wp = w.as_ptr().add(o * row_bytes);
            let mut j = 0;
            while j < m {
                let n = (m - j).min(4);
                let put = |vals: &[f32]| {
                    for (r, &v) in vals.iter().enumerate() {
                        *out.add((j + r) * ldo + o) = v;
                    }
                };
                match n {
                    4 => put(&k4(wp, nb, &acts[j..])),
                    3 => put(&k3(wp, nb, &acts[j..])),
                    2 => put(&k2(wp, nb, &acts[j..])),
                    _ => put(&k1(wp, nb, &acts[j..])),
                }
                j += n;
            }
        }
    }
}
