//! Where the query meets the vectors: an exact top-k scan over the in-memory matrix.
//!
//! Vectors are unit-normalized on the way in, so cosine similarity is a dot product. The scan
//! reads every stored vector once per query: at 1M chunks of dimension 384 that is 1.5 GB of
//! memory traffic, which bounds latency by memory bandwidth, not arithmetic (see
//! docs/BENCHMARKS.md, "Document store", for the measured numbers). Segments are scanned in
//! parallel with rayon, each keeping its own top-k, and the partial results are merged.
//!
//! Beyond a configured size (`StoreOptions::ann_threshold`, default 1M chunks: the size this
//! scan was measured to serve in tens of milliseconds on 2 cores, past which its latency
//! keeps growing linearly) searches go through the IVF index in `ivf` instead. It sits behind
//! [`crate::index::Index::top_k`], the only caller of [`exact_top_k`]; it follows the row
//! moves that [`crate::index::Index`] makes (`push` appends a row, removal moves the last row
//! into the hole: see `Matrix::swap_remove`), and it re-scores its candidates with [`dot`] and
//! orders them by [`Hit`], so that scores stay exact cosines and ties break the same way: only
//! recall is given up, never score accuracy. This scan stays the reference its recall is
//! tested against, and what serves every store at or below the threshold.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rayon::prelude::*;

use crate::matrix::Matrix;

/// One scored row. Ordered by score, then by lower row first, so results are deterministic
/// when scores tie.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hit {
    pub(crate) score: f32,
    pub(crate) row: u32,
}

impl PartialEq for Hit {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Hit {}
impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Hit {
    /// "Greater" means "better": higher score, then lower row.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.row.cmp(&self.row))
    }
}

/// The `k` rows with the highest dot product with `query`, best first.
pub(crate) fn exact_top_k(matrix: &Matrix, query: &[f32], k: usize) -> Vec<Hit> {
    if k == 0 || matrix.is_empty() {
        return Vec::new();
    }
    let dim = matrix.dim();
    let partials: Vec<Vec<Hit>> = matrix
        .segments()
        .par_iter()
        .enumerate()
        .map(|(s, segment)| {
            let base = (s * Matrix::SEGMENT_ROWS) as u32;
            best_k(
                segment
                    .chunks_exact(dim)
                    .enumerate()
                    .map(|(i, row)| Hit { score: dot(query, row), row: base + i as u32 }),
                k,
            )
        })
        .collect();
    merge(partials, k)
}

/// The best `k` of `hits` (in no particular order): a min-heap of the best seen so far,
/// whose root is the one to evict.
pub(crate) fn best_k(hits: impl Iterator<Item = Hit>, k: usize) -> Vec<Hit> {
    let mut best: BinaryHeap<std::cmp::Reverse<Hit>> = BinaryHeap::with_capacity(k + 1);
    for hit in hits {
        if best.len() < k {
            best.push(std::cmp::Reverse(hit));
        } else if let Some(worst) = best.peek()
            && hit > worst.0
        {
            best.pop();
            best.push(std::cmp::Reverse(hit));
        }
    }
    best.into_iter().map(|r| r.0).collect()
}

/// The best `k` of several partial results, best first.
pub(crate) fn merge(partials: Vec<Vec<Hit>>, k: usize) -> Vec<Hit> {
    let mut all: Vec<Hit> = partials.into_iter().flatten().collect();
    all.sort_unstable_by(|a, b| b.cmp(a));
    all.truncate(k);
    all
}

/// Dot product written so that the compiler keeps 16 independent partial sums in vector
/// registers (plain SSE2 on x86-64 without `target-cpu`); a single running sum would be one
/// long dependency chain and several times slower.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn dot_matches_naive_for_all_tail_lengths() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for len in 0..70 {
            let a: Vec<f32> = (0..len).map(|_| rng.random::<f32>() - 0.5).collect();
            let b: Vec<f32> = (0..len).map(|_| rng.random::<f32>() - 0.5).collect();
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - naive).abs() < 1e-5, "len {len}");
        }
    }

    #[test]
    fn top_k_matches_sorting_across_segments() {
        let dim = 8;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let mut m = Matrix::new(dim);
        let n = Matrix::SEGMENT_ROWS * 2 + 17;
        let mut rows = Vec::new();
        for _ in 0..n {
            let mut v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() - 0.5).collect();
            crate::normalize(&mut v).unwrap();
            m.push(&v);
            rows.push(v);
        }
        // Duplicate rows tie exactly: the lower row must come first.
        let dup = rows[5].clone();
        m.push(&dup);
        rows.push(dup);
        let q: Vec<f32> = rows[5].clone();
        for k in [1, 2, 10, 100] {
            let got = exact_top_k(&m, &q, k);
            let mut want: Vec<Hit> =
                rows.iter().enumerate().map(|(i, r)| Hit { score: dot(&q, r), row: i as u32 }).collect();
            want.sort_unstable_by(|a, b| b.cmp(a));
            want.truncate(k);
            assert_eq!(got.iter().map(|h| h.row).collect::<Vec<_>>(), want.iter().map(|h| h.row).collect::<Vec<_>>());
        }
        let top2 = exact_top_k(&m, &q, 2);
        assert_eq!((top2[0].row, top2[1].row), (5, n as u32));
        assert!(exact_top_k(&m, &q, 0).is_empty());
        assert_eq!(exact_top_k(&m, &q, n + 10).len(), n + 1);
    }
}
