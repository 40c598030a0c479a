//! The portable kernels: every format through one integer path, on any CPU. They define
//! what the SIMD kernels compute (the same integer sums, the same scales), so the tests can
//! hold each SIMD path to them, and they serve CPUs without a SIMD path.

use super::{
    QuantFormat,
    act::{ActKind, ActRow},
};

/// Values per scale in a format's blocks: 16 for Q6_K, 32 for the others.
pub(crate) const fn group(format: QuantFormat) -> usize {
    if matches!(format, QuantFormat::Q6_K) { 16 } else { 32 }
}

/// One block's values as unsigned bytes `q` with a scale `s` and an offset `mb` per
/// [`group`]: value = `s·q + mb`. (Q8_0's signed values are shifted by 128.)
pub(crate) fn unpack_block(format: QuantFormat, b: &[u8], q: &mut [u8], s: &mut [f32], mb: &mut [f32]) {
    block_values(format, b, q);
    block_scales(format, b, s, mb);
}

/// The scales and offsets of [`unpack_block`].
pub(crate) fn block_scales(format: QuantFormat, b: &[u8], s: &mut [f32], mb: &mut [f32]) {
    use super::format::{f16_at, scale_min_k4};
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => {
            let d = f16_at(b, 0);
            let offset = match format {
                QuantFormat::Q4_0 => -8.0,
                QuantFormat::Q5_0 => -16.0,
                _ => -128.0,
            };
            (s[0], mb[0]) = (d, offset * d);
        }
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => (s[0], mb[0]) = (f16_at(b, 0), f16_at(b, 2)),
        QuantFormat::Q4_K | QuantFormat::Q5_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &b[4..16]);
                (s[j], mb[j]) = (d * sc as f32, -dmin * m as f32);
            }
        }
        QuantFormat::Q6_K => {
            let d = f16_at(b, 208);
            for k in 0..16 {
                s[k] = d * (b[192 + k] as i8) as f32;
                mb[k] = -32.0 * s[k];
            }
        }
        other => unreachable!("{other} has no kernels"),
    }
}

/// The values of [`unpack_block`].
pub(crate) fn block_values(format: QuantFormat, b: &[u8], q: &mut [u8]) {
    use super::format::{q5_high, q6_quad};
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
            let (qs, qh) = match format {
                QuantFormat::Q4_0 => (&b[2..18], None),
                QuantFormat::Q4_1 => (&b[4..20], None),
                QuantFormat::Q5_0 => (&b[6..22], Some(u32::from_le_bytes([b[2], b[3], b[4], b[5]]))),
                _ => (&b[8..24], Some(u32::from_le_bytes([b[4], b[5], b[6], b[7]]))),
            };
            for j in 0..16 {
                let (h0, h1) = qh.map_or((0, 0), |qh| q5_high(qh, j));
                q[j] = (qs[j] & 0x0F) | h0;
                q[j + 16] = (qs[j] >> 4) | h1;
            }
        }
        QuantFormat::Q8_0 => {
            for (q, &v) in q.iter_mut().zip(&b[2..34]) {
                *q = v ^ 0x80;
            }
        }
        QuantFormat::Q4_K | QuantFormat::Q5_K => {
            let high = format == QuantFormat::Q5_K;
            let qs = if high { &b[48..176] } else { &b[16..144] };
            for j in 0..4 {
                for l in 0..32 {
                    let (mut lo, mut hi) = (qs[32 * j + l] & 0x0F, qs[32 * j + l] >> 4);
                    if high {
                        lo |= ((b[16 + l] >> (2 * j)) & 1) << 4;
                        hi |= ((b[16 + l] >> (2 * j + 1)) & 1) << 4;
                    }
                    q[64 * j + l] = lo;
                    q[64 * j + 32 + l] = hi;
                }
            }
        }
        QuantFormat::Q6_K => {
            for half in 0..2 {
                let (ql, qh) = (&b[64 * half..64 * half + 64], &b[128 + 32 * half..128 + 32 * half + 32]);
                for l in 0..32 {
                    for (t, v) in q6_quad(ql, qh, l).into_iter().enumerate() {
                        q[128 * half + 32 * t + l] = v;
                    }
                }
            }
        }
        other => unreachable!("{other} has no kernels"),
    }
}

/// `x · W_row` for one weight row, activations quantized as `kind` (blocks a multiple of
/// the format's [`group`]). The offsets' and mins' share comes from the activations' block
/// sums where `kind` keeps one per group (ggml's rounding of `Q8_1`'s), else from `Σq`.
pub(crate) fn dot(format: QuantFormat, w_row: &[u8], x: ActRow<'_>, kind: ActKind) -> f32 {
    let act_block = kind.block();
    let (be, bb) = format.geometry();
    let g = group(format);
    let (mut q, mut s, mut mb) = ([0u8; 256], [0f32; 16], [0f32; 16]);
    let mut acc = 0.0f32;
    for (bi, blk) in w_row.chunks_exact(bb).enumerate() {
        unpack_block(format, blk, &mut q[..be], &mut s, &mut mb);
        for gi in 0..be / g {
            let k0 = bi * be + gi * g;
            let dx = x.d[k0 / act_block];
            let (idot, isum) = x.qs[k0..k0 + g]
                .iter()
                .zip(&q[gi * g..(gi + 1) * g])
                .fold((0i32, 0i32), |(a, b), (&xv, &qv)| (a + xv as i32 * qv as i32, b + xv as i32));
            let sum = if act_block == g { x.sums[k0 / g] } else { dx * isum as f32 };
            acc += s[gi] * dx * idot as f32 + mb[gi] * sum;
        }
    }
    acc
}
