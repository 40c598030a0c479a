//! GGUF metadata: the typed key/value section of the header, with getters that fail with the
//! key's name when it is missing or holds another type.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// One metadata value, with the GGUF type it was stored as.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array. GGUF arrays are homogeneous, so each element type gets its own vector:
/// a 150k-entry token list costs one `Vec<String>`, not 150k tagged values.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Value {
    /// The GGUF type name, for error messages.
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "u8".into(),
            Value::I8(_) => "i8".into(),
            Value::U16(_) => "u16".into(),
            Value::I16(_) => "i16".into(),
            Value::U32(_) => "u32".into(),
            Value::I32(_) => "i32".into(),
            Value::U64(_) => "u64".into(),
            Value::I64(_) => "i64".into(),
            Value::F32(_) => "f32".into(),
            Value::F64(_) => "f64".into(),
            Value::Bool(_) => "bool".into(),
            Value::String(_) => "string".into(),
            Value::Array(a) => format!("array of {}", a.element_type_name()),
        }
    }

    /// Any integer value that is exactly representable as `i128` (all of them).
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn element_type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "u8",
            Array::I8(_) => "i8",
            Array::U16(_) => "u16",
            Array::I16(_) => "i16",
            Array::U32(_) => "u32",
            Array::I32(_) => "i32",
            Array::U64(_) => "u64",
            Array::I64(_) => "i64",
            Array::F32(_) => "f32",
            Array::F64(_) => "f64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }
}

/// All metadata entries of a file, in file order.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds an entry; a repeated key is a malformed file (readers would disagree on which wins).
    pub(crate) fn insert(&mut self, key: String, value: Value) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(Error::BadMetadata { key, reason: "key appears twice".into() });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| Error::MissingKey(key.to_string()))
    }

    fn mismatch(key: &str, expected: &'static str, found: &Value) -> Error {
        Error::KeyType { key: key.to_string(), expected, found: found.type_name() }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(Self::mismatch(key, "string", other)),
        }
    }

    /// Integer of any stored width, if it fits: writers disagree on u32 vs u64 for sizes.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_integer()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| Self::mismatch(key, "an integer in u32 range", v))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_integer()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| Self::mismatch(key, "an integer in u64 range", v))
    }

    pub fn get_i64(&self, key: &str) -> Result<i64> {
        let v = self.require(key)?;
        v.as_integer()
            .and_then(|i| i64::try_from(i).ok())
            .ok_or_else(|| Self::mismatch(key, "an integer in i64 range", v))
    }

    /// f32 or f64 (narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            other => Err(Self::mismatch(key, "f32", other)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            other => Err(Self::mismatch(key, "bool", other)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Array> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(Self::mismatch(key, "array", other)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        match self.get_array(key)? {
            Array::String(v) => Ok(v),
            other => Err(Self::array_mismatch(key, "array of string", other)),
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Result<&[i32]> {
        match self.get_array(key)? {
            Array::I32(v) => Ok(v),
            other => Err(Self::array_mismatch(key, "array of i32", other)),
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        match self.get_array(key)? {
            Array::F32(v) => Ok(v),
            other => Err(Self::array_mismatch(key, "array of f32", other)),
        }
    }

    fn array_mismatch(key: &str, expected: &'static str, found: &Array) -> Error {
        Error::KeyType { key: key.to_string(), expected, found: format!("array of {}", found.element_type_name()) }
    }

    /// `Ok(None)` when the key is absent; an error when it is present with another type.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.optional(key, Self::get_str)
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.optional(key, Self::get_u32)
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.optional(key, Self::get_f32)
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.optional(key, Self::get_bool)
    }

    fn optional<'a, T>(&'a self, key: &str, get: impl FnOnce(&'a Self, &str) -> Result<T>) -> Result<Option<T>> {
        if self.contains(key) { get(self, key).map(Some) } else { Ok(None) }
    }
}
