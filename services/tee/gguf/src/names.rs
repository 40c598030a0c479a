//! GGUF tensor names ↔ Hugging Face checkpoint names, and the llama-architecture Q/K row
//! order.
//!
//! # Why Q/K rows differ for `llama`
//! HF Llama checkpoints apply RoPE with `rotate_half`: inside each head of size `D`, element
//! `i` rotates with element `i + D/2` at frequency `θ^(-2i/D)`. llama.cpp's `llama`
//! architecture instead rotates adjacent pairs `(2i, 2i+1)` (ggml "normal" RoPE), so
//! `convert_hf_to_gguf.py` permutes the rows of `q_proj`/`k_proj` (weights and biases):
//!
//! ```text
//! w.reshape(n_head, 2, D/2, in).swapaxes(1, 2).reshape(n_head·D, in)
//! ```
//!
//! i.e. GGUF row `h·D + 2i + j` is HF row `h·D + j·D/2 + i` (`j ∈ {0,1}`, `i < D/2`), with
//! `n_head` = attention heads for Q and KV heads for K. [`unpermute_qk_rows`] undoes it.
//! Qwen2/Qwen3 GGUFs are not permuted (llama.cpp uses NeoX-style RoPE for them, the same as
//! HF's `rotate_half`), so their rows are already in HF order.
//!
//! Both conventions give identical attention; only the pairing of RoPE must match the row
//! order. [`crate::GgufFile::tensor_f32_hf`] returns HF order for every supported
//! architecture, so model code can apply `rotate_half` RoPE everywhere.

use crate::error::{Error, Result};
use crate::file::{GgufFile, TensorInfo};

/// How llama.cpp pairs dimensions for RoPE in an architecture's Q/K rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs `(2i, 2i+1)`: ggml's normal RoPE; Q/K rows are permuted relative to HF.
    Interleaved,
    /// Pairs `(i, i + D/2)`: NeoX RoPE, HF's `rotate_half`; rows are in HF order.
    HalfSplit,
}

/// The RoPE layout llama.cpp uses for the architectures this crate maps to HF names.
pub fn rope_layout(arch: &str) -> Option<RopeLayout> {
    match arch {
        "llama" => Some(RopeLayout::Interleaved),
        "qwen2" | "qwen3" => Some(RopeLayout::HalfSplit),
        _ => None,
    }
}

/// Per-layer names: (GGUF suffix after `blk.N.`, HF suffix after `model.layers.N.`).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// HF name of a GGUF tensor of a Llama/Qwen2/Qwen3 model, `None` for names without one
/// (e.g. `rope_freqs.weight`).
pub fn gguf_to_hf(name: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL_NAMES.iter().find(|(g, _)| *g == name) {
        return Some(hf.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (_, hf) = LAYER_NAMES.iter().find(|(g, _)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{hf}"))
}

/// GGUF name of an HF tensor name; inverse of [`gguf_to_hf`].
pub fn hf_to_gguf(name: &str) -> Option<String> {
    if let Some((g, _)) = GLOBAL_NAMES.iter().find(|(_, hf)| *hf == name) {
        return Some(g.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (g, _) = LAYER_NAMES.iter().find(|(_, hf)| *hf == suffix)?;
    Some(format!("blk.{layer}.{g}"))
}

/// Reorders rows from llama.cpp's interleaved RoPE order to HF's half-split order.
///
/// `data` is row-major with `row_len` values per row (1 for a bias) and `n_head · D` rows.
/// HF row `h·D + j·D/2 + i` is taken from GGUF row `h·D + 2i + j`.
pub fn unpermute_qk_rows<T: Copy + Default>(data: &[T], n_head: usize, row_len: usize) -> Result<Vec<T>> {
    permute_rows(data, n_head, row_len, |h, d, i, j| (h * d + 2 * i + j, h * d + j * d / 2 + i))
}

/// The converter's direction (HF → GGUF order); the inverse of [`unpermute_qk_rows`].
pub fn permute_qk_rows<T: Copy + Default>(data: &[T], n_head: usize, row_len: usize) -> Result<Vec<T>> {
    permute_rows(data, n_head, row_len, |h, d, i, j| (h * d + j * d / 2 + i, h * d + 2 * i + j))
}

/// `map(head, head_dim, i, j) -> (source row, destination row)`.
fn permute_rows<T: Copy + Default>(
    data: &[T],
    n_head: usize,
    row_len: usize,
    map: impl Fn(usize, usize, usize, usize) -> (usize, usize),
) -> Result<Vec<T>> {
    let rows = data.len().checked_div(row_len).unwrap_or(0);
    if n_head == 0 || row_len == 0 || !data.len().is_multiple_of(row_len) || !rows.is_multiple_of(2 * n_head) {
        return Err(Error::BadTensor {
            name: "(Q/K rows)".into(),
            reason: format!("{} values in rows of {row_len} do not split into {n_head} heads of even size", data.len()),
        });
    }
    let d = rows / n_head;
    let mut out = vec![T::default(); data.len()];
    for h in 0..n_head {
        for i in 0..d / 2 {
            for j in 0..2 {
                let (src, dst) = map(h, d, i, j);
                out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&data[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    Ok(out)
}

impl GgufFile {
    /// The tensor with HF name `hf_name`, dequantized, in HF layout: same shape as the HF
    /// checkpoint (`[out, in]` for linears) and, for `llama` Q/K, rows restored to
    /// `rotate_half` order. Lets one loader serve safetensors and GGUF alike. An absent
    /// `lm_head.weight` means tied embeddings: use `model.embed_tokens.weight`.
    pub fn tensor_f32_hf(&self, hf_name: &str) -> Result<Vec<f32>> {
        let (name, info) = self.hf_info(hf_name)?;
        let data = self.tensor_f32(&name)?;
        let row_len = if info.ne.len() == 1 { 1 } else { info.ne[0] as usize };
        self.to_hf_rows(hf_name, &name, data, row_len)
    }

    /// [`GgufFile::tensor_f32_hf`], except that a matrix in a block format the products run
    /// on (see [`tensor::quant::QuantFormat::has_kernels`]) is kept as its blocks, with the
    /// same row order. Everything else is dequantized.
    pub fn tensor_data_hf(&self, hf_name: &str) -> Result<tensor::WeightData> {
        let (name, info) = self.hf_info(hf_name)?;
        let format = info.dtype.quant_format().filter(|f| f.has_kernels());
        let (Some(format), [cols, rows]) = (format, info.ne.as_slice()) else {
            return Ok(tensor::WeightData::F32(self.tensor_f32_hf(hf_name)?.into()));
        };
        let (rows, cols) = (*rows as usize, *cols as usize);
        let row_bytes = info.n_bytes() / rows.max(1);
        let bytes = self.to_hf_rows(hf_name, &name, self.tensor_bytes(&name)?.to_vec(), row_bytes)?;
        let q = tensor::quant::QuantMatrix::new(format, rows, cols, bytes.into())
            .map_err(|e| Error::BadTensor { name: name.clone(), reason: e.to_string() })?;
        Ok(tensor::WeightData::Quant(q))
    }

    fn hf_info(&self, hf_name: &str) -> Result<(String, &TensorInfo)> {
        let name =
            hf_to_gguf(hf_name).ok_or_else(|| Error::MissingTensor(format!("{hf_name} (no GGUF equivalent)")))?;
        let info = self.tensor_info(&name).map_err(|_| Error::MissingTensor(format!("{name} (HF {hf_name})")))?;
        Ok((name, info))
    }

    /// `data` (rows of `row_len` elements of any type) in HF row order: `llama` Q/K rows
    /// are permuted back, everything else is returned as it is.
    fn to_hf_rows<T: Copy + Default>(&self, hf_name: &str, name: &str, data: Vec<T>, row_len: usize) -> Result<Vec<T>> {
        let is_q = hf_name.ends_with("self_attn.q_proj.weight") || hf_name.ends_with("self_attn.q_proj.bias");
        let is_k = hf_name.ends_with("self_attn.k_proj.weight") || hf_name.ends_with("self_attn.k_proj.bias");
        if !(is_q || is_k) {
            return Ok(data);
        }
        let arch = self.architecture()?;
        match rope_layout(arch) {
            Some(RopeLayout::HalfSplit) => Ok(data),
            Some(RopeLayout::Interleaved) => {
                let heads_key = if is_q { "attention.head_count" } else { "attention.head_count_kv" };
                let n_head = match self.metadata().opt_u32(&format!("{arch}.{heads_key}"))? {
                    Some(n) => n,
                    None => self.metadata().get_u32(&format!("{arch}.attention.head_count"))?,
                } as usize;
                unpermute_qk_rows(&data, n_head, row_len).map_err(|e| match e {
                    Error::BadTensor { reason, .. } => Error::BadTensor { name: name.to_string(), reason },
                    other => other,
                })
            }
            None => Err(Error::BadMetadata {
                key: "general.architecture".into(),
                reason: format!("no known RoPE layout for `{arch}`, cannot restore HF order of {hf_name}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for g in [
            "token_embd.weight",
            "output.weight",
            "output_norm.weight",
            "blk.0.attn_q.weight",
            "blk.23.attn_k.bias",
            "blk.7.ffn_down.weight",
            "blk.3.attn_k_norm.weight",
        ] {
            let hf = gguf_to_hf(g).unwrap();
            assert_eq!(hf_to_gguf(&hf).as_deref(), Some(g), "{g} -> {hf}");
        }
        assert_eq!(gguf_to_hf("blk.12.ffn_norm.weight").unwrap(), "model.layers.12.post_attention_layernorm.weight");
        assert_eq!(gguf_to_hf("rope_freqs.weight"), None);
        assert_eq!(gguf_to_hf("blk.x.attn_q.weight"), None);
        assert_eq!(hf_to_gguf("model.layers.1.mlp.experts.0.w1"), None);
    }

    /// The converter's permute, written as numpy does it (reshape/swapaxes), checked against
    /// our index formula and undone by `unpermute_qk_rows`.
    #[test]
    fn unpermute_inverts_converter_permute() {
        let (n_head, d, row_len) = (3, 8, 5);
        let data: Vec<f32> = (0..n_head * d * row_len).map(|x| x as f32).collect();
        // numpy: reshape(n_head, 2, d/2, row_len).swapaxes(1, 2) -> [h][i][j][c] = in[h][j][i][c]
        let mut converter = Vec::new();
        for h in 0..n_head {
            for i in 0..d / 2 {
                for j in 0..2 {
                    let row = h * d + j * d / 2 + i;
                    converter.extend_from_slice(&data[row * row_len..(row + 1) * row_len]);
                }
            }
        }
        assert_eq!(permute_qk_rows(&data, n_head, row_len).unwrap(), converter);
        assert_eq!(unpermute_qk_rows(&converter, n_head, row_len).unwrap(), data);
        assert!(unpermute_qk_rows(&data[..data.len() - row_len], n_head, row_len).is_err());
    }

    /// Interleaved RoPE on GGUF-ordered rows equals rotate_half RoPE on HF-ordered rows,
    /// up to the same row permutation: the reason the unpermute is needed and sufficient.
    #[test]
    fn interleaved_rope_matches_rotate_half_after_unpermute() {
        let (n_head, d, pos, theta) = (2usize, 8usize, 5.0f32, 10000.0f32);
        let q_hf: Vec<f32> = (0..n_head * d).map(|x| ((x * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let q_gguf = permute_qk_rows(&q_hf, n_head, 1).unwrap();
        let angle = |i: usize| pos * theta.powf(-2.0 * i as f32 / d as f32);
        let mut rot_hf = q_hf.clone();
        let mut rot_gguf = q_gguf.clone();
        for h in 0..n_head {
            let (a, b) = (&q_hf[h * d..(h + 1) * d], &q_gguf[h * d..(h + 1) * d]);
            for i in 0..d / 2 {
                let (s, c) = angle(i).sin_cos();
                rot_hf[h * d + i] = a[i] * c - a[i + d / 2] * s;
                rot_hf[h * d + i + d / 2] = a[i + d / 2] * c + a[i] * s;
                rot_gguf[h * d + 2 * i] = b[2 * i] * c - b[2 * i + 1] * s;
                rot_gguf[h * d + 2 * i + 1] = b[2 * i + 1] * c + b[2 * i] * s;
            }
        }
        assert_eq!(unpermute_qk_rows(&rot_gguf, n_head, 1).unwrap(), rot_hf);
    }
}
