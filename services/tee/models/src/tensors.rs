//! Reading named tensors from a model's weight files, whatever their format.
//!
//! safetensors (f32, f16, bf16) are memory-mapped and served in their stored precision;
//! GGUF tensors are served under their Hugging Face names in HF layout (see `gguf::names`),
//! so model code is written once in HF terms: matrices in a block format the products run
//! on stay as their blocks ([`WeightData::Quant`]), the rest is dequantized to f32.

use std::{collections::HashMap, path::Path, sync::Arc};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::Dtype;
use tensor::WeightData;

use crate::error::{ModelError, Result, io};

/// A tensor: its shape (row-major, PyTorch order) and elements.
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: WeightData,
}

impl Tensor {
    /// The elements as f32 (exact for every stored format).
    pub fn f32(&self) -> Vec<f32> {
        self.data.to_f32().to_vec()
    }
}

struct StEntry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

enum Store {
    Safetensors {
        maps: Vec<Mmap>,
        index: HashMap<String, StEntry>,
    },
    Gguf(gguf::GgufFile),
    /// Deterministic random weights of given shapes (benchmarks at real model shapes
    /// without the files); norms are ones, everything else N(0, 0.02²).
    Random {
        shapes: HashMap<String, Vec<usize>>,
        seed: u64,
    },
}

/// All tensors of one model.
pub struct Tensors(Store);

impl Tensors {
    /// Opens every `*.safetensors` file in `root`, or the GGUF file `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if path.extension().is_some_and(|e| e == "gguf") {
            return Ok(Tensors(Store::Gguf(gguf::GgufFile::open(path)?)));
        }
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(io(path))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::Config(format!("no .safetensors or .gguf weights in {}", path.display())));
        }
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for (i, p) in files.iter().enumerate() {
            let f = std::fs::File::open(p).map_err(io(p))?;
            // SAFETY: the file is opened read-only; model files are not modified while served.
            let map = unsafe { Mmap::map(&f) }.map_err(io(p))?;
            let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map)
                .map_err(|e| ModelError::Config(format!("{}: {e}", p.display())))?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                index.insert(
                    name.clone(),
                    StEntry { file: i, dtype: info.dtype, shape: info.shape.clone(), start: base + s, end: base + e },
                );
            }
            maps.push(map);
        }
        Ok(Tensors(Store::Safetensors { maps, index }))
    }

    /// Random tensors with these names and shapes (seeded per name).
    pub fn random(shapes: HashMap<String, Vec<usize>>, seed: u64) -> Self {
        Tensors(Store::Random { shapes, seed })
    }

    pub fn has(&self, name: &str) -> bool {
        match &self.0 {
            Store::Random { shapes, .. } => shapes.contains_key(name),
            Store::Safetensors { index, .. } => index.contains_key(name),
            Store::Gguf(g) => gguf::names::hf_to_gguf(name).is_some_and(|n| g.has_tensor(&n)),
        }
    }

    /// The tensor `name`, or `MissingTensor(name)`.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        match &self.0 {
            Store::Safetensors { maps, index } => {
                let e = index.get(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
                let bytes = &maps[e.file][e.start..e.end];
                let data = match e.dtype {
                    Dtype::F32 => WeightData::F32(
                        bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
                    ),
                    Dtype::F16 => WeightData::F16(
                        bytes.chunks_exact(2).map(|c| f16::from_le_bytes(c.try_into().unwrap())).collect(),
                    ),
                    Dtype::BF16 => WeightData::Bf16(
                        bytes.chunks_exact(2).map(|c| bf16::from_le_bytes(c.try_into().unwrap())).collect(),
                    ),
                    other => {
                        return Err(ModelError::UnsupportedDtype {
                            name: name.to_string(),
                            dtype: format!("{other:?}"),
                        });
                    }
                };
                Ok(Tensor { shape: e.shape.clone(), data })
            }
            Store::Random { shapes, seed } => {
                let shape = shapes.get(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?.clone();
                let n: usize = shape.iter().product();
                let norm = name.contains("norm") || name.contains("LayerNorm.weight");
                let data: Vec<f32> = if norm && !name.ends_with("bias") {
                    vec![1.0; n]
                } else {
                    use rand::{RngExt, SeedableRng};
                    let h = name.bytes().fold(*seed ^ 0x9e37_79b9_7f4a_7c15, |a, b| a.rotate_left(5) ^ b as u64);
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(h);
                    // Uniform with the variance of N(0, 0.02²): cheap and bounded.
                    let a = 0.02 * 3f32.sqrt();
                    (0..n).map(|_| rng.random_range(-a..a)).collect()
                };
                Ok(Tensor { shape, data: WeightData::F32(Arc::from(data)) })
            }
            Store::Gguf(g) => {
                let gname = gguf::names::hf_to_gguf(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
                if !g.has_tensor(&gname) {
                    return Err(ModelError::MissingTensor(format!("{name} (GGUF {gname})")));
                }
                let info = g.tensor_info(&gname)?;
                // GGUF dims are innermost first; PyTorch order is the reverse.
                let shape: Vec<usize> = info.ne.iter().rev().map(|&d| d as usize).collect();
                Ok(Tensor { shape, data: g.tensor_data_hf(name)? })
            }
        }
    }

    /// The tensor as f32, checked against `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.get(name)?;
        check_shape(name, &t.shape, shape)?;
        Ok(t.f32())
    }

    /// The tensor in its stored precision, checked against `shape`.
    pub fn weight(&self, name: &str, shape: &[usize]) -> Result<WeightData> {
        let t = self.get(name)?;
        check_shape(name, &t.shape, shape)?;
        Ok(t.data)
    }

    /// The first of `names` that exists (checkpoints differ in prefixes).
    pub fn first_of<'a>(&self, names: &[&'a str]) -> Result<&'a str> {
        names.iter().find(|n| self.has(n)).copied().ok_or_else(|| ModelError::MissingTensor(names.join(" or ")))
    }
}

fn check_shape(name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    // A trailing/leading 1 is the same tensor (e.g. [1, 384] vs [384]).
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if got != expected && squeeze(got) != squeeze(expected) {
        return Err(ModelError::TensorShape { name: name.to_string(), expected: expected.to_vec(), got: got.to_vec() });
    }
    Ok(())
}
