//! Public weights as the device holds them: uploaded once, in the layout they were
//! registered in, as f32 or as two 16-bit values per `u32` word.

use half::{bf16, f16};
use tensor::{Precision, Weight, WeightData, WeightLayout};

use crate::shaders::WeightType;

/// A weight resident on the device.
pub(crate) struct GpuWeight {
    /// Unique per registration: keys the bind groups cached with it.
    pub serial: u64,
    pub buffer: wgpu::Buffer,
    pub d_in: usize,
    pub d_out: usize,
    pub layout: WeightLayout,
    pub wtype: WeightType,
    /// Row stride in elements of the stored layout (even for 16-bit storage).
    pub ld: usize,
    pub bytes: u64,
}

/// The element type a weight is stored in: f32 weights as `f32_as` says, f16 checkpoints as
/// f16, bf16 checkpoints as `bf16_as` says (16-bit either way: bf16 is widened exactly in the
/// kernels) unless f16 would overflow one of their values.
pub(crate) fn storage_for(data: &WeightData, f32_as: Precision, bf16_as: Precision) -> Precision {
    match data {
        WeightData::F32(_) | WeightData::Quant(_) => f32_as,
        WeightData::F16(_) => Precision::F16,
        WeightData::Bf16(d) if bf16_as == Precision::F16 && d.iter().all(|v| fits_f16(v.to_f32())) => Precision::F16,
        WeightData::Bf16(_) => Precision::Bf16,
    }
}

/// Whether `v` rounds to a finite f16 (or is not finite to begin with).
fn fits_f16(v: f32) -> bool {
    !v.is_finite() || f16::from_f32(v).is_finite()
}

pub(crate) fn wtype(p: Precision) -> WeightType {
    match p {
        Precision::F32 => WeightType::F32,
        Precision::F16 => WeightType::F16,
        Precision::Bf16 => WeightType::Bf16,
    }
}

/// `(rows, contiguous length)` of the stored layout.
pub(crate) fn stored_shape(w: &Weight) -> (usize, usize) {
    match w.layout {
        WeightLayout::InOut => (w.d_in, w.d_out),
        WeightLayout::OutIn => (w.d_out, w.d_in),
    }
}

/// Row stride of the stored layout: 16-bit rows are padded to an even length so that a
/// row never starts inside a word.
pub(crate) fn stored_ld(contig: usize, storage: Precision) -> usize {
    match storage {
        Precision::F32 => contig,
        _ => contig.next_multiple_of(2),
    }
}

/// Bytes the weight occupies on the device.
pub(crate) fn stored_bytes(w: &Weight, storage: Precision) -> u64 {
    let (rows, contig) = stored_shape(w);
    let ld = stored_ld(contig, storage);
    (rows * ld * if storage == Precision::F32 { 4 } else { 2 }) as u64
}

/// Writes the weight's stored bytes into `out` (exactly [`stored_bytes`] long), converting
/// the element type if `storage` differs from the data's, never reordering elements.
pub(crate) fn pack_into(w: &Weight, storage: Precision, out: &mut [u8]) {
    let (rows, contig) = stored_shape(w);
    let ld = stored_ld(contig, storage);
    match storage {
        Precision::F32 => {
            let data = w.data.to_f32();
            out.copy_from_slice(bytemuck::cast_slice(&data));
        }
        Precision::F16 | Precision::Bf16 => {
            // Blocks are widened at registration; this keeps `pack_into` total anyway.
            let widened = matches!(w.data, WeightData::Quant(_)).then(|| w.data.to_f32());
            let bits = |i: usize| -> u16 {
                match (&w.data, storage) {
                    (WeightData::Quant(_), p) => {
                        let v = widened.as_ref().map_or(0.0, |d| d[i]);
                        if p == Precision::F16 { f16::from_f32(v).to_bits() } else { bf16::from_f32(v).to_bits() }
                    }
                    (WeightData::F16(d), Precision::F16) => d[i].to_bits(),
                    (WeightData::Bf16(d), Precision::Bf16) => d[i].to_bits(),
                    (WeightData::F32(d), Precision::F16) => f16::from_f32(d[i]).to_bits(),
                    (WeightData::F32(d), _) => bf16::from_f32(d[i]).to_bits(),
                    // `storage_for` never stores an f16 checkpoint as bf16; a bf16 one becomes
                    // f16 for the matrix units.
                    (WeightData::F16(d), _) => bf16::from_f32(d[i].to_f32()).to_bits(),
                    (WeightData::Bf16(d), _) => f16::from_f32(d[i].to_f32()).to_bits(),
                }
            };
            for r in 0..rows {
                let row = &mut out[r * ld * 2..(r + 1) * ld * 2];
                for c in 0..contig {
                    row[2 * c..2 * c + 2].copy_from_slice(&bits(r * contig + c).to_le_bytes());
                }
                row[contig * 2..].fill(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_rows_of_16_bit_weights_are_padded_to_whole_words() {
        let w = Weight {
            d_in: 3,
            d_out: 2,
            layout: WeightLayout::OutIn,
            data: WeightData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0].into()),
        };
        assert_eq!(stored_bytes(&w, Precision::F16), 2 * 4 * 2);
        let mut out = vec![0xAA; 16];
        pack_into(&w, Precision::F16, &mut out);
        let halves: Vec<f32> =
            out.chunks(2).map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()).collect();
        assert_eq!(halves, vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0]);
    }

    #[test]
    fn bf16_checkpoints_keep_their_bits() {
        let vals = [bf16::from_f32(1.5), bf16::from_f32(-3.25e-3)];
        let w = Weight { d_in: 1, d_out: 2, layout: WeightLayout::InOut, data: WeightData::Bf16(vals.to_vec().into()) };
        let p = storage_for(&w.data, Precision::F32, Precision::Bf16);
        assert_eq!(p, Precision::Bf16);
        let mut out = vec![0; stored_bytes(&w, p) as usize];
        pack_into(&w, p, &mut out);
        assert_eq!(u16::from_le_bytes([out[0], out[1]]), vals[0].to_bits());
        assert_eq!(u16::from_le_bytes([out[2], out[3]]), vals[1].to_bits());
    }

    /// For the matrix units bf16 checkpoints become f16, rounded to nearest; one value
    /// beyond f16's range keeps the whole weight in bf16 rather than storing an infinity.
    #[test]
    fn bf16_checkpoints_become_f16_only_where_every_value_fits() {
        let w = |vals: &[f32]| Weight {
            d_in: vals.len(),
            d_out: 1,
            layout: WeightLayout::OutIn,
            data: WeightData::Bf16(vals.iter().map(|&v| bf16::from_f32(v)).collect()),
        };
        let small = w(&[1.5, -3.25e-3, 6.0e4]);
        assert_eq!(storage_for(&small.data, Precision::F32, Precision::F16), Precision::F16);
        let mut out = vec![0; stored_bytes(&small, Precision::F16) as usize];
        pack_into(&small, Precision::F16, &mut out);
        let halves: Vec<f16> = out.chunks(2).map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]]))).collect();
        let want = |v: f32| f16::from_f32(bf16::from_f32(v).to_f32());
        assert_eq!(halves[..3], [want(1.5), want(-3.25e-3), want(6.0e4)]);
        // Exact from 2⁻¹⁴ up: every bf16 of that magnitude below 2¹⁶ is an f16 too.
        for bits in 0..=u16::MAX {
            let v = bf16::from_bits(bits).to_f32();
            if v.abs() >= 2f32.powi(-14) && v.abs() < 65536.0 {
                assert_eq!(f16::from_f32(v).to_f32(), v, "{v:e}");
            }
        }
        let large = w(&[1.5, 7.0e4]);
        assert_eq!(storage_for(&large.data, Precision::F32, Precision::F16), Precision::Bf16);
        assert_eq!(storage_for(&small.data, Precision::F32, Precision::Bf16), Precision::Bf16);
    }
}
