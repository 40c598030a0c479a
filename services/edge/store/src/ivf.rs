//! IVF-Flat: the approximate top-k for stores beyond the exact scan's reach.
//!
//! The unit vectors are partitioned by k-means into about √N lists (a list per centroid); a
//! query scores the centroids, scans the rows of the `nprobe` nearest lists and re-scores
//! them with the same [`dot`] as the exact scan, so every returned score is the exact cosine
//! and ties break the same way; what can differ from the exact scan is only which rows were
//! looked at (the recall). With √N lists a probe reads about `nprobe / √N` of the vectors.
//!
//! Why IVF rather than HNSW: its state is 12 bytes per row plus √N centroids (HNSW keeps tens
//! of neighbour links per row), it reads the vectors where the matrix already holds them (no
//! second copy: the matrix is reordered instead, see below), and it follows the matrix's row
//! moves with O(1) work per move, where removing a node from a graph index means repairing
//! its neighbours' links.
//!
//! Training is spherical k-means (Lloyd iterations, centroids re-normalized) on a seeded
//! random sample of the rows, so the same rows build the same index. The lists are then filled
//! by assigning every row to its nearest centroid: that pass costs N × √N dot products and
//! dominates the build. After the build the rows are renumbered list by list
//! (`make_contiguous`, applied to the matrix by the owner), because the probe is otherwise
//! bound by memory latency: rows scattered over the matrix cost a cache and TLB miss each,
//! and at 200,000 chunks that made a probe of 7% of the rows cost 40% of a full scan instead
//! of 10%. Rows pushed after the build join their nearest existing centroid (at the end of
//! the matrix, so outside the runs); the centroids are not updated, which is why the owner
//! rebuilds when the row count has doubled since the last build (see `Index::refresh_ann`).

use std::cmp::Ordering;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::matrix::Matrix;
use crate::search::{Hit, best_k, dot, merge};

/// Lloyd iterations. Few are needed: lists only have to be coherent enough that a query's
/// neighbours fall in its nearest few, and the probe re-scores exactly anyway.
const ITERATIONS: usize = 8;
/// Training rows per list: enough to place each centroid, and training then costs a small
/// fraction of the assignment pass over all rows.
const SAMPLE_PER_LIST: usize = 32;
/// Candidate rows per parallel task of a probe.
const SCAN_ROWS: usize = 2048;
const SEED: u64 = 0x6765_6c6f_5f69_7666; // "gelo_ivf"

pub(crate) struct Ivf {
    dim: usize,
    /// `lists.len()` unit centroids of `dim` values each.
    centroids: Vec<f32>,
    /// The rows of each list, in no particular order.
    lists: Vec<Vec<u32>>,
    /// For each row of the matrix: its list and its position in that list.
    place: Vec<(u32, u32)>,
    /// The row count the index was built for.
    built_for: usize,
}

impl Ivf {
    /// Trains the centroids on a sample of `matrix` and assigns every row. `matrix` must not
    /// be empty.
    pub(crate) fn build(matrix: &Matrix) -> Ivf {
        let (n, dim) = (matrix.len(), matrix.dim());
        assert!(n > 0, "an IVF index needs rows to train on");
        let nlist = ((n as f64).sqrt().round() as usize).clamp(1, n);
        let mut rng = ChaCha8Rng::seed_from_u64(SEED);
        // Random order: the first `nlist` sampled rows are the initial centroids.
        let sample_rows = rand::seq::index::sample(&mut rng, n, (nlist * SAMPLE_PER_LIST).min(n)).into_vec();
        let mut sample = Vec::with_capacity(sample_rows.len() * dim);
        for &r in &sample_rows {
            sample.extend_from_slice(matrix.row(r));
        }
        let mut centroids = sample[..nlist * dim].to_vec();
        for _ in 0..ITERATIONS {
            let assigned: Vec<u32> = sample.par_chunks_exact(dim).map(|v| nearest(&centroids, dim, v)).collect();
            let mut sums = vec![0f64; nlist * dim];
            let mut counts = vec![0usize; nlist];
            for (v, &c) in sample.chunks_exact(dim).zip(&assigned) {
                counts[c as usize] += 1;
                for (s, x) in sums[c as usize * dim..][..dim].iter_mut().zip(v) {
                    *s += *x as f64;
                }
            }
            for (c, centroid) in centroids.chunks_exact_mut(dim).enumerate() {
                let sum = &sums[c * dim..][..dim];
                let norm = sum.iter().map(|s| s * s).sum::<f64>().sqrt();
                if counts[c] == 0 || norm == 0.0 {
                    // An empty list restarts at a random training row instead of staying idle.
                    let r = rand::RngExt::random_range(&mut rng, 0..sample_rows.len());
                    centroid.copy_from_slice(&sample[r * dim..][..dim]);
                } else {
                    for (x, s) in centroid.iter_mut().zip(sum) {
                        *x = (s / norm) as f32;
                    }
                }
            }
        }
        let assigned: Vec<Vec<u32>> = matrix
            .segments()
            .par_iter()
            .map(|segment| segment.chunks_exact(dim).map(|v| nearest(&centroids, dim, v)).collect())
            .collect();
        let mut ivf =
            Ivf { dim, centroids, lists: vec![Vec::new(); nlist], place: Vec::with_capacity(n), built_for: n };
        for (row, list) in assigned.into_iter().flatten().enumerate() {
            ivf.append(row as u32, list);
        }
        ivf
    }

    /// Renumbers the rows so that each list's rows are consecutive, list after list, and
    /// returns the new order (new row `i` is former row `order[i]`) for the owner to apply to
    /// the matrix: a probe then reads runs of adjacent rows instead of rows scattered over the
    /// whole matrix, each a cache and TLB miss.
    pub(crate) fn make_contiguous(&mut self) -> Vec<u32> {
        let order: Vec<u32> = self.lists.iter().flatten().copied().collect();
        let mut next = 0u32;
        for (l, members) in self.lists.iter_mut().enumerate() {
            for (p, row) in members.iter_mut().enumerate() {
                *row = next;
                self.place[next as usize] = (l as u32, p as u32);
                next += 1;
            }
        }
        order
    }

    pub(crate) fn built_for(&self) -> usize {
        self.built_for
    }

    #[cfg(test)]
    pub(crate) fn lists(&self) -> usize {
        self.lists.len()
    }

    fn append(&mut self, row: u32, list: u32) {
        debug_assert_eq!(row as usize, self.place.len());
        let members = &mut self.lists[list as usize];
        self.place.push((list, members.len() as u32));
        members.push(row);
    }

    /// Follows `Matrix::push`: `row` (the new last row) holds `vector`.
    pub(crate) fn push(&mut self, row: u32, vector: &[f32]) {
        let list = nearest(&self.centroids, self.dim, vector);
        self.append(row, list);
    }

    /// Follows `Matrix::swap_remove(row)`, which returned `moved`: `row` is gone and, if
    /// `moved` is `Some(from)`, the row that was at `from` (the last one) is now at `row`.
    pub(crate) fn swap_remove(&mut self, row: usize, moved: Option<usize>) {
        let (list, pos) = self.place[row];
        let members = &mut self.lists[list as usize];
        members.swap_remove(pos as usize);
        if let Some(&shifted) = members.get(pos as usize) {
            self.place[shifted as usize].1 = pos;
        }
        if let Some(from) = moved {
            let (l, p) = self.place[from];
            self.lists[l as usize][p as usize] = row as u32;
            self.place[row] = (l, p);
        }
        self.place.pop();
    }

    /// The lists a query reads: the `nprobe` nearest, and more if those hold fewer than `k`
    /// rows, so that a query gets `k` hits whenever the store has them.
    fn probe(&self, query: &[f32], k: usize, nprobe: usize) -> Vec<u32> {
        let mut order: Vec<(f32, u32)> =
            self.centroids.chunks_exact(self.dim).enumerate().map(|(c, v)| (dot(query, v), c as u32)).collect();
        order.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut rows = 0;
        let mut lists = Vec::with_capacity(nprobe);
        for (_, c) in order {
            if lists.len() >= nprobe && rows >= k {
                break;
            }
            rows += self.lists[c as usize].len();
            lists.push(c);
        }
        lists
    }

    /// The best `k` rows among the probed lists, scored and ordered exactly as by
    /// [`crate::search::exact_top_k`].
    pub(crate) fn top_k(&self, matrix: &Matrix, query: &[f32], k: usize, nprobe: usize) -> Vec<Hit> {
        if k == 0 || matrix.is_empty() {
            return Vec::new();
        }
        // The probed lists' rows in ascending order, so that they are read in address order:
        // a list's rows are consecutive after a build (`make_contiguous`), so this reads long
        // runs of adjacent rows, and the rows added since the build at least in order. It also
        // splits the work evenly across threads.
        let mut rows: Vec<u32> =
            self.probe(query, k, nprobe).iter().flat_map(|&c| self.lists[c as usize].iter().copied()).collect();
        rows.par_sort_unstable();
        let partials: Vec<Vec<Hit>> = rows
            .par_chunks(SCAN_ROWS)
            .map(|rows| best_k(rows.iter().map(|&row| Hit { score: dot(query, matrix.row(row as usize)), row }), k))
            .collect();
        merge(partials, k)
    }
}

/// The centroid with the highest dot product with `v` (the lowest index on a tie).
fn nearest(centroids: &[f32], dim: usize, v: &[f32]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0u32);
    for (c, centroid) in centroids.chunks_exact(dim).enumerate() {
        let s = dot(v, centroid);
        if s.total_cmp(&best.0) == Ordering::Greater {
            best = (s, c as u32);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::exact_top_k;
    use rand::{RngExt, SeedableRng};

    use crate::random_unit as unit;

    /// `n` random unit rows of `dim` values.
    fn random_matrix(rng: &mut ChaCha8Rng, n: usize, dim: usize) -> Matrix {
        let mut m = Matrix::new(dim);
        for _ in 0..n {
            m.push(&unit(rng, dim));
        }
        m
    }

    /// `n` unit vectors around the given centres, each at cosine about 0.7 from its centre.
    fn clustered(rng: &mut ChaCha8Rng, n: usize, centres: &[Vec<f32>]) -> Vec<Vec<f32>> {
        (0..n)
            .map(|_| {
                let c = &centres[rng.random_range(0..centres.len())];
                let noise = unit(rng, c.len());
                let mut v: Vec<f32> = c.iter().zip(&noise).map(|(a, b)| a + b).collect();
                crate::normalize(&mut v).unwrap();
                v
            })
            .collect()
    }

    fn recall(got: &[Hit], want: &[Hit]) -> usize {
        got.iter().filter(|h| want.iter().any(|w| w.row == h.row)).count()
    }

    #[test]
    fn recall_against_the_exact_scan_on_clustered_vectors() {
        let (n, dim, k) = (20_000, 64, 10);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut m = Matrix::new(dim);
        let centres: Vec<Vec<f32>> = (0..200).map(|_| unit(&mut rng, dim)).collect();
        for v in clustered(&mut rng, n, &centres) {
            m.push(&v);
        }
        let ivf = Ivf::build(&m);
        assert_eq!(ivf.lists(), 141);
        assert!(ivf.lists.iter().all(|l| !l.is_empty()), "k-means left an empty list");
        // Queries from the same distribution as the rows, not rows themselves.
        let queries = clustered(&mut rng, 200, &centres);
        let (mut found, mut scanned) = (0, 0);
        for q in &queries {
            let exact = exact_top_k(&m, q, k);
            let got = ivf.top_k(&m, q, k, 8);
            assert_eq!(got.len(), k);
            // Re-scored exactly: each score is the exact scan's score of that row, and the
            // order follows the same rule.
            for h in &got {
                assert_eq!(h.score.to_bits(), dot(q, m.row(h.row as usize)).to_bits());
            }
            assert!(got.windows(2).all(|w| w[0] > w[1]));
            found += recall(&got, &exact);
            scanned += ivf.probe(q, k, 8).iter().map(|&c| ivf.lists[c as usize].len()).sum::<usize>();
        }
        let r = found as f64 / (queries.len() * k) as f64;
        assert!(r >= 0.95, "recall@10 {r}");
        // And it is an index: 8 of 141 lists read well under a tenth of the rows.
        let frac = scanned as f64 / (queries.len() * n) as f64;
        assert!(frac < 0.1, "scanned {frac} of the rows");
    }

    /// Renumbering, then random pushes and swap_removes: every row is in exactly one list,
    /// where `place` says, and probing every list is the exact scan.
    #[test]
    fn follows_pushes_and_row_moves() {
        let dim = 8;
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let mut m = random_matrix(&mut rng, 500, dim);
        let mut ivf = Ivf::build(&m);
        let order = ivf.make_contiguous();
        m.permute(&order);
        let mut start = 0;
        for members in &ivf.lists {
            assert_eq!(*members, (start..start + members.len() as u32).collect::<Vec<_>>());
            start += members.len() as u32;
        }
        for _ in 0..3000 {
            if m.len() > 1 && rng.random_bool(0.5) {
                let row = rng.random_range(0..m.len());
                let moved = m.swap_remove(row);
                ivf.swap_remove(row, moved);
            } else {
                let v = unit(&mut rng, dim);
                let row = m.push(&v) as u32;
                ivf.push(row, &v);
            }
        }
        assert_eq!(ivf.place.len(), m.len());
        let mut seen = vec![false; m.len()];
        for (l, members) in ivf.lists.iter().enumerate() {
            for (p, &row) in members.iter().enumerate() {
                assert!(!seen[row as usize], "row {row} twice");
                seen[row as usize] = true;
                assert_eq!(ivf.place[row as usize], (l as u32, p as u32));
            }
        }
        assert!(seen.iter().all(|&s| s));
        let q = unit(&mut rng, dim);
        let all = ivf.lists.len();
        let got: Vec<u32> = ivf.top_k(&m, &q, 20, all).iter().map(|h| h.row).collect();
        let want: Vec<u32> = exact_top_k(&m, &q, 20).iter().map(|h| h.row).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn probes_more_lists_until_it_has_k_rows() {
        let dim = 4;
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let m = random_matrix(&mut rng, 100, dim);
        let ivf = Ivf::build(&m);
        let q = unit(&mut rng, dim);
        // One list of ten holds about ten rows: asking for 60 must read more of them.
        assert_eq!(ivf.top_k(&m, &q, 60, 1).len(), 60);
        assert_eq!(ivf.top_k(&m, &q, 500, 1).len(), 100);
        assert!(ivf.top_k(&m, &q, 0, 1).is_empty());
    }
}
