//! ggml's block formats: their geometry and their dequantization to f32.
//!
//! Each function follows ggml's reference `dequantize_row_*` (ggml-quants.c) operation for
//! operation, so results are bit-identical to it (the float products are evaluated in the
//! same order; nothing is fused). The GGUF reader serves its dequantization from here, and
//! the product kernels are checked against it.

use half::f16;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// A ggml block format this crate can hold and dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
}

impl QuantFormat {
    /// `(elements, bytes)` of one block.
    pub const fn geometry(self) -> (usize, usize) {
        match self {
            QuantFormat::Q4_0 => (32, 18),
            QuantFormat::Q4_1 => (32, 20),
            QuantFormat::Q5_0 => (32, 22),
            QuantFormat::Q5_1 => (32, 24),
            QuantFormat::Q8_0 => (32, 34),
            QuantFormat::Q2_K => (QK_K, 84),
            QuantFormat::Q3_K => (QK_K, 110),
            QuantFormat::Q4_K => (QK_K, 144),
            QuantFormat::Q5_K => (QK_K, 176),
            QuantFormat::Q6_K => (QK_K, 210),
            QuantFormat::Q8_K => (QK_K, 292),
        }
    }

    pub const fn block_elements(self) -> usize {
        self.geometry().0
    }

    pub const fn block_bytes(self) -> usize {
        self.geometry().1
    }

    /// Whether products run on the blocks in place (int8 kernels). The others (Q2_K, Q3_K,
    /// and Q8_K, which is an activation format) are dequantized when loaded.
    pub const fn has_kernels(self) -> bool {
        !matches!(self, QuantFormat::Q2_K | QuantFormat::Q3_K | QuantFormat::Q8_K)
    }

    /// ggml's name of the format.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q5_0 => "Q5_0",
            QuantFormat::Q5_1 => "Q5_1",
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q2_K => "Q2_K",
            QuantFormat::Q3_K => "Q3_K",
            QuantFormat::Q4_K => "Q4_K",
            QuantFormat::Q5_K => "Q5_K",
            QuantFormat::Q6_K => "Q6_K",
            QuantFormat::Q8_K => "Q8_K",
        }
    }

    /// Dequantizes one block (`block_bytes` bytes) into `y` (`block_elements` values).
    pub fn dequantize_block(self, b: &[u8], y: &mut [f32]) {
        match self {
            QuantFormat::Q4_0 => q4_0(b, y),
            QuantFormat::Q4_1 => q4_1(b, y),
            QuantFormat::Q5_0 => q5_0(b, y),
            QuantFormat::Q5_1 => q5_1(b, y),
            QuantFormat::Q8_0 => q8_0(b, y),
            QuantFormat::Q2_K => q2_k(b, y),
            QuantFormat::Q3_K => q3_k(b, y),
            QuantFormat::Q4_K => q4_k(b, y),
            QuantFormat::Q5_K => q5_k(b, y),
            QuantFormat::Q6_K => q6_k(b, y),
            QuantFormat::Q8_K => q8_k(b, y),
        }
    }

    /// Dequantizes whole blocks: `bytes.len() / block_bytes` blocks into as many times
    /// `block_elements` values of `y`.
    pub fn dequantize(self, bytes: &[u8], y: &mut [f32]) {
        let (n, size) = self.geometry();
        for (b, y) in bytes.chunks_exact(size).zip(y.chunks_exact_mut(n)) {
            self.dequantize_block(b, y);
        }
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
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

/// The fifth bits of a Q5 block's 32 elements: bit j of `qh` belongs to element j.
#[inline(always)]
pub(crate) fn q5_high(qh: u32, j: usize) -> (u8, u8) {
    ((((qh >> j) << 4) & 0x10) as u8, ((qh >> (j + 12)) & 0x10) as u8)
}

/// `d: f16, qh: u32, qs[16]`: bit j of qh is the fifth bit of element j; offset by 16.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
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
        let (h0, h1) = q5_high(qh, j);
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
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
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
            let [q1, q2, q3, q4] = q6_quad(ql, qh, l);
            y[l] = d * (sc[is] as i8) as f32 * (q1 as i8 - 32) as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * (q2 as i8 - 32) as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * (q3 as i8 - 32) as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * (q4 as i8 - 32) as f32;
        }
    }
}

/// The unsigned 6-bit values (0..64) of a Q6_K half at `l`, `l + 32`, `l + 64`, `l + 96`.
#[inline(always)]
pub(crate) fn q6_quad(ql: &[u8], qh: &[u8], l: usize) -> [u8; 4] {
    [
        (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
        (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
    ]
}

/// `d: f32, qs: [i8; 256], bsums: [i16; 16]` (bsums only serve dot products).
fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *y = d * (q as i8) as f32;
    }
}
