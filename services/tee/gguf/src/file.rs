//! An opened GGUF file: the parsed header over a memory map of the whole file. Tensor data is
//! read from the map on demand, so opening a 500 MB model costs only the header parse.

use std::collections::HashMap;
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::dequant;
use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::metadata::Metadata;
use crate::parse::{check_tensor, parse_header};

/// Where a tensor lives and how it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml dimensions, innermost (contiguous) first: a linear layer with `in` inputs and
    /// `out` outputs has `ne = [in, out]`.
    pub ne: Vec<u64>,
    pub dtype: GgmlType,
    /// Offset of the data from the start of the data section, as stored in the file.
    pub offset: u64,
    range: Range<usize>,
}

impl TensorInfo {
    pub fn n_elements(&self) -> usize {
        self.ne.iter().product::<u64>() as usize
    }

    pub fn n_bytes(&self) -> usize {
        self.range.len()
    }

    /// Row-major shape, outermost first (PyTorch order): `ne` reversed. A linear weight is
    /// `[out_features, in_features]`, an embedding `[vocab, hidden]`, a norm `[hidden]`.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

enum Backing {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

pub struct GgufFile {
    path: Option<PathBuf>,
    bytes: Backing,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps the file and parses its header; every tensor's byte range is checked against the
    /// file length here, so later reads cannot go out of bounds.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value. Like every mmap-based model
        // loader we assume the file is not truncated or rewritten while it is open; doing so
        // is outside this crate's contract (the data could change under us).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let mut this = Self::parse(Backing::Mapped(map))?;
        this.path = Some(path.to_path_buf());
        Ok(this)
    }

    /// Parses a GGUF image held in memory (tests, or files fetched into a buffer).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(bytes: Backing) -> Result<Self> {
        let header = parse_header(&bytes)?;
        let mut tensors = Vec::with_capacity(header.tensors.len());
        let mut by_name = HashMap::with_capacity(header.tensors.len());
        for raw in header.tensors {
            let (dtype, range) = check_tensor(&raw, header.alignment, header.data_offset, bytes.len())?;
            if by_name.insert(raw.name.clone(), tensors.len()).is_some() {
                return Err(Error::BadTensor { name: raw.name, reason: "name appears twice".into() });
            }
            tensors.push(TensorInfo { name: raw.name, ne: raw.ne, dtype, offset: raw.offset, range });
        }
        Ok(Self {
            path: None,
            bytes,
            version: header.version,
            metadata: header.metadata,
            tensors,
            by_name,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// `general.architecture`: "llama", "qwen2", "qwen3", ...
    pub fn architecture(&self) -> Result<&str> {
        self.metadata.get_str("general.architecture")
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i]).ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    /// The tensor's stored bytes (still quantized), for callers that keep weights packed.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor_info(name)?;
        Ok(&self.bytes[info.range.clone()])
    }

    /// The tensor dequantized to f32, row-major in [`TensorInfo::shape`] order: for a 2-D
    /// tensor `ne = [n0, n1]` that is `n1` rows of `n0` values, i.e. PyTorch's
    /// `[out_features, in_features]` for a linear weight. GGUF stores data in exactly this
    /// order, so no transpose happens here. (Llama-architecture Q/K rows are still in
    /// llama.cpp's RoPE order: see [`crate::names`].)
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        if !info.dtype.can_dequantize() {
            return Err(Error::UnsupportedType { name: name.to_string(), dtype: info.dtype });
        }
        dequant::dequantize(info.dtype, &self.bytes[info.range.clone()])
    }
}
