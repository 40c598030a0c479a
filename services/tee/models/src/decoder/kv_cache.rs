//! The KV cache of one sequence: RoPE'd keys and values of every position so far, per layer
//! and KV head, kept in TEE memory and scrubbed when dropped.

use tensor::Matrix;

/// Keys and values of one sequence, per layer and KV head, in TEE memory.
pub struct KvCache {
    /// `k[layer][kv_head]`: one row per position.
    pub(super) k: Vec<Vec<Matrix>>,
    /// `v[layer][kv_head]`: one row per position.
    pub(super) v: Vec<Vec<Matrix>>,
    /// Positions held.
    pub(super) len: usize,
}

impl KvCache {
    /// An empty cache for `layers` layers of `kv_heads` heads of `head_dim`.
    pub(super) fn new(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        let per_layer = || (0..kv_heads).map(|_| Matrix::zeros(0, head_dim)).collect::<Vec<_>>();
        KvCache { k: (0..layers).map(|_| per_layer()).collect(), v: (0..layers).map(|_| per_layer()).collect(), len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held (keys and values).
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).flatten().map(|m| m.as_slice().len() * 4).sum()
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        // Cached keys and values are plaintext activations of the prompt.
        self.k.iter_mut().chain(self.v.iter_mut()).flatten().for_each(Matrix::scrub);
    }
}
