//! Dequantization of ggml blocks to f32, following ggml's reference `dequantize_row_*`
//! functions (ggml-quants.c) operation for operation, so results are bit-identical to them
//! (the float products are evaluated in the same order; nothing is fused).
//!
//! Blocks are independent, so the work is split across rayon tasks of a few thousand
//! elements each.

use half::f16;
use rayon::prelude::*;

use crate::dtype::{GgmlType, QK_K};
use crate::error::{Error, Result};

/// Elements one rayon task dequantizes: large enough to amortize scheduling, small enough to
/// balance a 136M-element embedding over any core count.
const ELEMENTS_PER_TASK: usize = 1 << 15;

/// Dequantizes `bytes`, a whole number of `dtype` blocks, into a new vector.
pub fn dequantize(dtype: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let (block, type_size) = dtype.block_geometry();
    if !bytes.len().is_multiple_of(type_size) {
        return Err(Error::Dequantize {
            dtype,
            len: bytes.len(),
            reason: format!("not a whole number of {type_size}-byte blocks"),
        });
    }
    let mut out = vec![0f32; bytes.len() / type_size * block];
    dequantize_into(dtype, bytes, &mut out)?;
    Ok(out)
}

/// Dequantizes into a caller-owned buffer of exactly `bytes.len() / type_size * block_size`
/// elements (lets callers reuse or pre-place memory).
pub fn dequantize_into(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (block, type_size) = dtype.block_geometry();
    if !bytes.len().is_multiple_of(type_size) || bytes.len() / type_size * block != out.len() {
        return Err(Error::Dequantize {
            dtype,
            len: bytes.len(),
            reason: format!("expected a whole number of {type_size}-byte blocks filling {} elements", out.len()),
        });
    }
    let kernel: fn(&[u8], &mut [f32]) = match dtype {
        GgmlType::F32 => f32_block,
        GgmlType::F16 => f16_block,
        GgmlType::BF16 => bf16_block,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::Q8_K => q8_k,
        _ => {
            return Err(Error::Dequantize { dtype, len: bytes.len(), reason: "no dequantizer for this type".into() });
        }
    };
    // Scalar types go through the same driver with "blocks" of many elements, so the kernel
    // call is amortized over a slice instead of made once per value.
    let (block, type_size) = match block {
        1 => (1024, 1024 * type_size),
        _ => (block, type_size),
    };
    let blocks_per_task = (ELEMENTS_PER_TASK / block).max(1);
    out.par_chunks_mut(block * blocks_per_task).zip(bytes.par_chunks(type_size * blocks_per_task)).for_each(
        |(out, bytes)| {
            // A scalar tail shorter than 1024 elements: the kernels handle any length.
            if dtype.block_size() == 1 {
                kernel(bytes, out);
                return;
            }
            for (o, b) in out.chunks_exact_mut(block).zip(bytes.chunks_exact(type_size)) {
                kernel(b, o);
            }
        },
    );
    Ok(())
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

fn f32_block(b: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(b.chunks_exact(4)) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

fn f16_block(b: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(b.chunks_exact(2)) {
        *y = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// bf16 is the top half of an f32.
fn bf16_block(b: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(b.chunks_exact(2)) {
        *y = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
}

/// `d: f16, qs[16]`: low nibbles are elements 0..16, high nibbles 16..32, offset by 8.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// `d: f16, m: f16, qs[16]`: y = q·d + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// `d: f16, qh: u32, qs[16]`: bit j of qh is the fifth bit of element j; offset by 16.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = (((qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

/// `d: f16, m: f16, qh: u32, qs[16]`: as Q5_0 without the offset, plus m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = ((qs[j] & 0x0F) | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

/// `d: f16, qs: [i8; 32]`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

/// `scales[16], qs[64], d: f16, dmin: f16`. Each scale byte holds a 4-bit scale (low) and a
/// 4-bit min (high) for 16 elements; each qs byte holds four 2-bit values, one per 32-element
/// group of a 128-element half.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let min = f16_at(b, 82);
    let mut is = 0;
    let mut out = 0;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for shift in [0u32, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0F) as f32;
                let ml = min * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[16 * part + l] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// `hmask[32], qs[64], scales[12], d: f16`. Sixteen 6-bit signed scales (offset 32) are
/// packed into 12 bytes: low nibbles in bytes 0..8, top two bits in bytes 8..12. A clear
/// hmask bit subtracts 4 from the 2-bit value.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let hm = &b[0..32];
    let qs = &b[32..96];
    let sb = &b[96..108];
    let d_all = f16_at(b, 108);
    let mut scales = [0i8; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 { sb[i] & 0x0F } else { sb[i - 8] >> 4 };
        let high = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i8 - 32;
    }
    let mut is = 0;
    let mut out = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for shift in [0u32, 2, 4, 6] {
            for part in 0..2 {
                let dl = d_all * scales[is] as f32;
                is += 1;
                for l in 16 * part..16 * part + 16 {
                    let v = ((q[l] >> shift) & 3) as i8 - if hm[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * v as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

/// Scale and min `j` (0..8) of a Q4_K/Q5_K super-block: 6-bit values packed into 12 bytes
/// (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `d: f16, dmin: f16, scales[12], qs[128]`: eight 32-element sub-blocks, y = d·sc·q − dmin·m.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let q = &qs[32 * j..32 * j + 32];
        let y = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `d: f16, dmin: f16, scales[12], qh[32], qs[128]`: Q4_K plus a fifth bit from qh.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        let ql = &qs[32 * j..32 * j + 32];
        let y = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// `ql[128], qh[64], scales: [i8; 16], d: f16`: 6-bit values offset by 32, one 8-bit scale
/// per 16 elements; y = (d·scale)·q.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// `d: f32, qs: [i8; 256], bsums: [i16; 16]` (bsums only serve dot products).
fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *y = d * (q as i8) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q4_0 by hand: d = 0.5, nibble pairs (lo, hi) = (j, 15 - j).
    #[test]
    fn q4_0_by_hand() {
        let mut b = vec![0u8; 18];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        for j in 0..16 {
            b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let y = dequantize(GgmlType::Q4_0, &b).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
    }

    /// Q5_0's fifth bits: qh bit j belongs to element j, for both nibble halves.
    #[test]
    fn q5_0_high_bits() {
        let mut b = vec![0u8; 22];
        b[0..2].copy_from_slice(&f16::from_f32(1.0).to_bits().to_le_bytes());
        let qh: u32 = (1 << 3) | (1 << 20);
        b[2..6].copy_from_slice(&qh.to_le_bytes());
        let y = dequantize(GgmlType::Q5_0, &b).unwrap();
        for (j, &v) in y.iter().enumerate() {
            let expected = if j == 3 || j == 20 { 0.0 } else { -16.0 };
            assert_eq!(v, expected, "element {j}");
        }
    }

    #[test]
    fn q8_k_by_hand() {
        let mut b = vec![0u8; 292];
        b[0..4].copy_from_slice(&0.25f32.to_le_bytes());
        for i in 0..256 {
            b[4 + i] = (i as i32 - 128) as i8 as u8;
        }
        let y = dequantize(GgmlType::Q8_K, &b).unwrap();
        for (i, &v) in y.iter().enumerate() {
            assert_eq!(v, (i as f32 - 128.0) * 0.25);
        }
    }

    #[test]
    fn scalar_tails_are_converted() {
        // 1500 values, one full 1024-element chunk and a 476-element tail; each is a 7-bit
        // integer times a power of two, exact in both f16 and bf16.
        let vals: Vec<f32> = (0..1500).map(|i| ((i % 200) as f32 - 100.0) * 2f32.powi(i % 7 - 3)).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes()).collect();
        assert_eq!(dequantize(GgmlType::F16, &bytes).unwrap(), vals);
        let bytes: Vec<u8> = vals.iter().flat_map(|&v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect();
        assert_eq!(dequantize(GgmlType::BF16, &bytes).unwrap(), vals);
    }

    #[test]
    fn partial_blocks_are_refused() {
        assert!(matches!(dequantize(GgmlType::Q6_K, &[0u8; 209]), Err(Error::Dequantize { .. })));
        assert!(matches!(dequantize(GgmlType::IQ2_XS, &[0u8; 74]), Err(Error::Dequantize { .. })));
    }
}
