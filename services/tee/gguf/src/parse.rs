//! Bounds-checked decoding of the GGUF header: magic, version, metadata and tensor infos.
//!
//! Layout (all little-endian):
//! `"GGUF" u32:version u64:n_tensors u64:n_kv`, then `n_kv` × `(string key, u32 type, value)`,
//! then `n_tensors` × `(string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset)`, then
//! padding to `general.alignment` (default 32) and the tensor data. Strings are `u64 len`
//! and UTF-8 bytes. Every count and length comes from the file, so none is trusted: reads
//! are checked against the bytes left and allocations are capped by what those bytes could
//! hold.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::metadata::{Array, Metadata, Value};

const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Deepest array-of-array nesting we accept; real files use none, and it bounds recursion.
const MAX_ARRAY_DEPTH: usize = 4;
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The decoded header; tensor offsets are still relative to `data_offset`.
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<RawTensorInfo>,
    pub alignment: u64,
    pub data_offset: usize,
}

pub(crate) struct RawTensorInfo {
    pub name: String,
    pub ne: Vec<u64>,
    pub type_id: u32,
    pub offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// `what` is built only on failure: it runs once per token string otherwise.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(Error::Truncated { what: what(), offset: self.pos, needed: n, available: self.remaining() });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        Ok(s.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<std::result::Result<String, std::string::FromUtf8Error>> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8(bytes.to_vec()))
    }
}

pub(crate) fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if &magic != MAGIC {
        return Err(Error::BadMagic(magic));
    }
    let version = c.u32(&|| "version".into())?;
    // v1 used 32-bit counts and lengths; big-endian files show up here as a byte-swapped
    // version number. Neither is produced by current tools.
    if !(2..=3).contains(&version) {
        return Err(Error::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c
            .string(&|| format!("key of metadata entry {i}"))?
            .map_err(|_| Error::BadMetadata { key: format!("#{i}"), reason: "key is not UTF-8".into() })?;
        let what = || format!("metadata key `{key}`");
        let type_id = c.u32(&what)?;
        let value = read_value(&mut c, type_id, &key, 0)?;
        metadata.insert(key, value)?;
    }

    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(_) => {
            let a = metadata.get_u32(ALIGNMENT_KEY)? as u64;
            if a == 0 || !a.is_power_of_two() {
                return Err(Error::BadMetadata {
                    key: ALIGNMENT_KEY.into(),
                    reason: format!("alignment {a} is not a power of two"),
                });
            }
            a
        }
    };

    // Each tensor info takes at least 8 (name len) + 4 + 4 + 8 bytes.
    let mut tensors = Vec::with_capacity(n_tensors.min(c.remaining() as u64 / 24) as usize);
    for i in 0..n_tensors {
        let name = c
            .string(&|| format!("name of tensor info {i}"))?
            .map_err(|_| Error::BadTensor { name: format!("#{i}"), reason: "name is not UTF-8".into() })?;
        let what = || format!("tensor info `{name}`");
        let n_dims = c.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(Error::BadTensor {
                name,
                reason: format!("{n_dims} dimensions, ggml allows at most {MAX_DIMS}"),
            });
        }
        let ne = (0..n_dims).map(|_| c.u64(&what)).collect::<Result<Vec<_>>>()?;
        let type_id = c.u32(&what)?;
        let offset = c.u64(&what)?;
        tensors.push(RawTensorInfo { name, ne, type_id, offset });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let data_offset = usize::try_from(data_offset).map_err(|_| Error::Truncated {
        what: "tensor data".into(),
        offset: c.pos,
        needed: data_offset,
        available: c.remaining(),
    })?;
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}

/// Size in bytes of a fixed-width GGUF scalar type, `None` for string/array/unknown.
fn scalar_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

fn read_value(c: &mut Cursor<'_>, type_id: u32, key: &str, depth: usize) -> Result<Value> {
    let what = || format!("value of metadata key `{key}`");
    let bad = |reason: String| Error::BadMetadata { key: key.to_string(), reason };
    Ok(match type_id {
        0 => Value::U8(c.array::<1>(&what)?[0]),
        1 => Value::I8(c.array::<1>(&what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        5 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => Value::Bool(read_bool(c.array::<1>(&what)?[0]).ok_or_else(|| bad("bool byte is not 0 or 1".into()))?),
        8 => Value::String(c.string(&what)?.map_err(|_| bad("string is not UTF-8".into()))?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(bad(format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
            }
            Value::Array(read_array(c, key, depth + 1)?)
        }
        10 => Value::U64(u64::from_le_bytes(c.array(&what)?)),
        11 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        t => return Err(bad(format!("unknown value type {t}"))),
    })
}

fn read_bool(b: u8) -> Option<bool> {
    match b {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array> {
    let what = || format!("array of metadata key `{key}`");
    let bad = |reason: String| Error::BadMetadata { key: key.to_string(), reason };
    let elem_type = c.u32(&what)?;
    let count = c.u64(&what)?;

    if let Some(size) = scalar_size(elem_type) {
        let total = count.checked_mul(size).ok_or_else(|| bad(format!("array length {count} overflows")))?;
        let bytes = c.take(total, &what)?;
        let n = size as usize;
        macro_rules! decode {
            ($variant:ident, $ty:ty) => {
                Array::$variant(bytes.chunks_exact(n).map(|b| <$ty>::from_le_bytes(b.try_into().unwrap())).collect())
            };
        }
        return Ok(match elem_type {
            0 => Array::U8(bytes.to_vec()),
            1 => Array::I8(bytes.iter().map(|&b| b as i8).collect()),
            2 => decode!(U16, u16),
            3 => decode!(I16, i16),
            4 => decode!(U32, u32),
            5 => decode!(I32, i32),
            6 => decode!(F32, f32),
            7 => Array::Bool(
                bytes
                    .iter()
                    .map(|&b| read_bool(b))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad("bool byte is not 0 or 1".into()))?,
            ),
            10 => decode!(U64, u64),
            11 => decode!(I64, i64),
            12 => decode!(F64, f64),
            _ => unreachable!("scalar_size covers exactly these ids"),
        });
    }

    match elem_type {
        8 => {
            // A string takes at least its 8-byte length.
            let mut v = Vec::with_capacity(count.min(c.remaining() as u64 / 8) as usize);
            for i in 0..count {
                let s = c
                    .string(&|| format!("element {i} of metadata key `{key}`"))?
                    .map_err(|_| bad(format!("element {i} is not UTF-8")))?;
                v.push(s);
            }
            Ok(Array::String(v))
        }
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(bad(format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
            }
            // A nested array takes at least its 12-byte header.
            let mut v = Vec::with_capacity(count.min(c.remaining() as u64 / 12) as usize);
            for _ in 0..count {
                v.push(read_array(c, key, depth + 1)?);
            }
            Ok(Array::Array(v))
        }
        t => Err(bad(format!("unknown array element type {t}"))),
    }
}

/// Resolves a raw tensor info against the file: known type, whole blocks per row, aligned
/// offset, bytes inside the file. Returns the dtype and the absolute byte range.
pub(crate) fn check_tensor(
    raw: &RawTensorInfo,
    alignment: u64,
    data_offset: usize,
    file_len: usize,
) -> Result<(GgmlType, std::ops::Range<usize>)> {
    let bad = |reason: String| Error::BadTensor { name: raw.name.clone(), reason };
    let dtype = GgmlType::from_id(raw.type_id).ok_or_else(|| bad(format!("unknown ggml type id {}", raw.type_id)))?;
    let (block, type_size) = dtype.block_geometry();
    let n_elements = raw
        .ne
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {:?} overflows", raw.ne)))?;
    let ne0 = raw.ne.first().copied().unwrap_or(1);
    if !ne0.is_multiple_of(block as u64) {
        return Err(bad(format!("row length {ne0} is not a multiple of the {dtype} block size {block}")));
    }
    let n_bytes = (n_elements / block as u64)
        .checked_mul(type_size as u64)
        .ok_or_else(|| bad(format!("shape {:?} overflows", raw.ne)))?;
    if !raw.offset.is_multiple_of(alignment) {
        return Err(bad(format!("data offset {} is not a multiple of the alignment {alignment}", raw.offset)));
    }
    let start = (data_offset as u64).checked_add(raw.offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_len as u64 => Ok((dtype, start as usize..end as usize)),
        _ => Err(bad(format!(
            "data [{} + {}, +{n_bytes} bytes) lies past the end of the file ({file_len} bytes)",
            data_offset, raw.offset
        ))),
    }
}
