//! A minimal GGUF writer for tests: builds byte images, including deliberately broken ones
//! (any type id, count or offset can be written as is).
#![allow(dead_code)]

pub struct Builder {
    pub version: u32,
    pub alignment: u64,
    kvs: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

impl Default for Builder {
    fn default() -> Self {
        Self { version: 3, alignment: 32, kvs: Vec::new(), n_kv: 0, infos: Vec::new(), n_tensors: 0, data: Vec::new() }
    }
}

pub fn string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl Builder {
    pub fn with_version(version: u32) -> Self {
        Self { version, ..Self::default() }
    }

    /// A key with a raw type id and raw value bytes.
    pub fn kv_raw(mut self, key: &str, type_id: u32, value: &[u8]) -> Self {
        self.kvs.extend(string(key));
        self.kvs.extend(type_id.to_le_bytes());
        self.kvs.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv_raw(key, 4, &v.to_le_bytes())
    }

    pub fn kv_str(self, key: &str, v: &str) -> Self {
        self.kv_raw(key, 8, &string(v))
    }

    /// An array header with any element type and count, followed by `payload`.
    pub fn kv_array_raw(self, key: &str, elem_type: u32, count: u64, payload: &[u8]) -> Self {
        let mut v = elem_type.to_le_bytes().to_vec();
        v.extend(count.to_le_bytes());
        v.extend_from_slice(payload);
        self.kv_raw(key, 9, &v)
    }

    /// A tensor info with explicit type id and offset; `data` is appended to the data
    /// section (aligned) only if `offset` is `None`, in which case the offset is computed.
    pub fn tensor_raw(mut self, name: &str, ne: &[u64], type_id: u32, offset: Option<u64>, data: &[u8]) -> Self {
        let offset = offset.unwrap_or_else(|| {
            let pad = (self.alignment as usize - self.data.len() % self.alignment as usize) % self.alignment as usize;
            self.data.extend(std::iter::repeat_n(0u8, pad));
            let at = self.data.len() as u64;
            self.data.extend_from_slice(data);
            at
        });
        self.infos.extend(string(name));
        self.infos.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(type_id.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    /// An F32 tensor holding `values`.
    pub fn tensor_f32(self, name: &str, ne: &[u64], values: &[f32]) -> Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor_raw(name, ne, 0, None, &bytes)
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kvs);
        out.extend(&self.infos);
        let pad = (self.alignment as usize - out.len() % self.alignment as usize) % self.alignment as usize;
        out.extend(std::iter::repeat_n(0u8, pad));
        out.extend(&self.data);
        out
    }
}
