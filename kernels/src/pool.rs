//! Recycled buffers for the large operands that cross the TEE/engine boundary.
//!
//! A masked linear at embedding shapes moves tens of MB per call: the masked input `U`, the
//! engine's read-back `U·W`, and the recovered product. A fresh buffer of that size comes
//! from the OS as untouched pages, and the first write to each 4 KiB page is a page fault;
//! inside a VM (and more so in a confidential one, which validates every new page) these
//! faults are expensive. The plain executor allocates one such buffer per call (the
//! product), the masked one three (`U`, `U·W`, the product).
//!
//! An engine keeps a [`BufferPool`] (`Engine::buffer` / `Engine::recycle`): its read-backs
//! come from it, and the masked executor takes `U` from it and returns `U` and `U·W` when
//! it has recovered the product. The pool holds only data that is *not secret* — masked
//! operands and engine results, which the untrusted engine sees anyway. It never holds
//! plaintext: the recovered product belongs to the model and is never given back.
//! [`BufferPool::take`] returns a buffer whose contents are unspecified (old masked data, or
//! zeros): the caller must overwrite every element.

use std::sync::Mutex;

/// Buffers smaller than this come from the allocator directly (its own caches serve them).
pub const MIN_ELEMS: usize = 64 * 1024;

/// What an engine's pool retains unless configured otherwise (1 GiB).
pub const DEFAULT_MAX_BYTES: usize = 1 << 30;

/// A pool of recycled `f32` buffers, retaining at most `max_bytes`.
pub struct BufferPool {
    bufs: Mutex<Vec<Vec<f32>>>,
    max_bytes: usize,
}

impl BufferPool {
    pub fn new(max_bytes: usize) -> Self {
        BufferPool { bufs: Mutex::new(Vec::new()), max_bytes }
    }

    /// A buffer of exactly `len` elements, recycled when one large enough is pooled (the
    /// smallest that fits). Its contents are unspecified: overwrite every element before
    /// reading any.
    pub fn take(&self, len: usize) -> Vec<f32> {
        if len >= MIN_ELEMS
            && let Some(mut v) = self.best_fit(len)
        {
            if v.len() >= len {
                v.truncate(len);
            } else {
                v.resize(len, 0.0);
            }
            return v;
        }
        vec![0.0; len]
    }

    /// An empty buffer with room for `len` elements (recycled when one large enough is
    /// pooled), for callers that append their data: nothing is zeroed first.
    pub fn take_empty(&self, len: usize) -> Vec<f32> {
        if len >= MIN_ELEMS
            && let Some(mut v) = self.best_fit(len)
        {
            v.clear();
            return v;
        }
        Vec::with_capacity(len)
    }

    fn best_fit(&self, len: usize) -> Option<Vec<f32>> {
        let mut pool = self.bufs.lock().expect("buffer pool poisoned");
        let i = pool
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        Some(pool.swap_remove(i))
    }

    /// Returns a buffer for reuse. Only for non-secret contents (masked operands, engine
    /// results); small buffers, and large ones the pool has no room for, are freed.
    pub fn give(&self, v: Vec<f32>) {
        if v.capacity() < MIN_ELEMS {
            return;
        }
        let mut pool = self.bufs.lock().expect("buffer pool poisoned");
        let held: usize = pool.iter().map(|b| b.capacity() * 4).sum();
        if held + v.capacity() * 4 <= self.max_bytes {
            pool.push(v);
            return;
        }
        // Full: keep the larger buffer (large ones are the costly ones to fault in again).
        if let Some((i, _)) = pool.iter().enumerate().min_by_key(|(_, b)| b.capacity()) {
            let smallest = pool[i].capacity();
            if smallest < v.capacity() && held - smallest * 4 + v.capacity() * 4 <= self.max_bytes {
                pool[i] = v;
            }
        }
    }

    /// Bytes currently pooled.
    pub fn held_bytes(&self) -> usize {
        self.bufs.lock().expect("buffer pool poisoned").iter().map(|b| b.capacity() * 4).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_best_fit_and_bounded() {
        let pool = BufferPool::new(MIN_ELEMS * 4 * 10);
        let big = pool.take(MIN_ELEMS * 4);
        assert_eq!(big.len(), MIN_ELEMS * 4);
        let (ptr, cap) = (big.as_ptr(), big.capacity());
        pool.give(big);
        assert_eq!(pool.held_bytes(), cap * 4);
        // A smaller request is served from the pooled buffer, cut to its length.
        let again = pool.take(MIN_ELEMS * 2);
        assert_eq!((again.len(), again.as_ptr()), (MIN_ELEMS * 2, ptr));
        assert_eq!(pool.held_bytes(), 0);
        // Grown back past its current length within its capacity: every element present.
        pool.give(again);
        let regrown = pool.take(MIN_ELEMS * 4);
        assert_eq!((regrown.len(), regrown.as_ptr()), (MIN_ELEMS * 4, ptr));
        // Larger than anything pooled: a fresh, zeroed buffer.
        pool.give(regrown);
        let fresh = pool.take(MIN_ELEMS * 8);
        assert_ne!(fresh.as_ptr(), ptr);
        assert!(fresh.iter().all(|&v| v == 0.0));
        // The bound: 4 + 8 units fit under 10 only by dropping the smaller for the larger.
        pool.give(fresh);
        assert_eq!(pool.held_bytes(), MIN_ELEMS * 8 * 4);
        // An empty buffer for appending reuses the pooled one without zeroing it.
        let empty = pool.take_empty(MIN_ELEMS * 6);
        assert!(empty.is_empty() && empty.capacity() >= MIN_ELEMS * 6);
        pool.give(empty);
        // Small buffers are never pooled.
        pool.give(vec![0.0; 16]);
        assert_eq!(pool.held_bytes(), MIN_ELEMS * 8 * 4);
    }
}
