//! Dequantization of ggml tensors to f32. Block formats are dequantized by
//! [`tensor::quant::QuantFormat`], which follows ggml's reference `dequantize_row_*`
//! functions (ggml-quants.c) operation for operation, so results are bit-identical to them;
//! the scalar types (F32, F16, BF16) are converted here.
//!
//! Blocks are independent, so the work is split across rayon tasks of a few thousand
//! elements each.

use half::f16;
use rayon::prelude::*;

use crate::dtype::GgmlType;
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
    let scalar: Option<Kernel> = match dtype {
        GgmlType::F32 => Some(f32_block),
        GgmlType::F16 => Some(f16_block),
        GgmlType::BF16 => Some(bf16_block),
        _ => None,
    };
    let blocks = dtype.quant_format();
    if scalar.is_none() && blocks.is_none() {
        return Err(Error::Dequantize { dtype, len: bytes.len(), reason: "no dequantizer for this type".into() });
    }
    let kernel = |b: &[u8], y: &mut [f32]| match (scalar, blocks) {
        (Some(f), _) => f(b, y),
        (None, Some(q)) => q.dequantize_block(b, y),
        (None, None) => unreachable!("refused above"),
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

/// A scalar type's conversion of a run of values.
type Kernel = fn(&[u8], &mut [f32]);

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
