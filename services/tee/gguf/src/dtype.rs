//! ggml tensor types: their on-disk ids and block geometry.
//!
//! Every ggml type stores `block_size` consecutive elements of a row in `type_size` bytes.
//! The table covers all ids a current GGUF file may hold, so a file is opened (and its byte
//! ranges validated) even when some of its tensors use a type we cannot dequantize.

use std::fmt;

/// A ggml tensor type, by the id stored in the GGUF tensor info (`enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

pub use tensor::quant::QK_K;

impl GgmlType {
    /// Maps the id stored in the file; ids retired by ggml (4, 5, 31–33, 36–38) and unknown
    /// future ids give `None`.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// `(elements per block, bytes per block)`, as in ggml's type traits.
    pub fn block_geometry(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 => (1, 2),
            BF16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2_K => (QK_K, 84),
            Q3_K => (QK_K, 110),
            Q4_K => (QK_K, 144),
            Q5_K => (QK_K, 176),
            Q6_K => (QK_K, 210),
            Q8_K => (QK_K, 292),
            IQ2_XXS => (QK_K, 66),
            IQ2_XS => (QK_K, 74),
            IQ3_XXS => (QK_K, 98),
            IQ1_S => (QK_K, 50),
            IQ4_NL => (32, 18),
            IQ3_S => (QK_K, 110),
            IQ2_S => (QK_K, 82),
            IQ4_XS => (QK_K, 136),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            F64 => (1, 8),
            IQ1_M => (QK_K, 56),
            TQ1_0 => (QK_K, 54),
            TQ2_0 => (QK_K, 66),
            MXFP4 => (32, 17),
        }
    }

    pub fn block_size(self) -> usize {
        self.block_geometry().0
    }

    pub fn type_size(self) -> usize {
        self.block_geometry().1
    }

    /// The block format, for the types the tensor crate holds in place or dequantizes.
    pub fn quant_format(self) -> Option<tensor::quant::QuantFormat> {
        use tensor::quant::QuantFormat as Q;
        Some(match self {
            GgmlType::Q4_0 => Q::Q4_0,
            GgmlType::Q4_1 => Q::Q4_1,
            GgmlType::Q5_0 => Q::Q5_0,
            GgmlType::Q5_1 => Q::Q5_1,
            GgmlType::Q8_0 => Q::Q8_0,
            GgmlType::Q2_K => Q::Q2_K,
            GgmlType::Q3_K => Q::Q3_K,
            GgmlType::Q4_K => Q::Q4_K,
            GgmlType::Q5_K => Q::Q5_K,
            GgmlType::Q6_K => Q::Q6_K,
            GgmlType::Q8_K => Q::Q8_K,
            _ => return None,
        })
    }

    /// Whether [`crate::dequantize`] handles this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(self, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
