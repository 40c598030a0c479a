//! The decrypted vectors, resident in memory for the scan: rows of `dim` f32 values in
//! fixed-size segments.
//!
//! Segments instead of one `Vec`: growing a 1.5 GB vector by doubling would copy it and briefly
//! need twice the memory; segments never move, and they are the unit of parallel work.
//! Rows are dense: removing a row moves the last row into its place (`swap_remove`), so the
//! scan never meets holes and the caller re-points whatever referred to the moved row.

pub(crate) struct Matrix {
    dim: usize,
    len: usize,
    segments: Vec<Vec<f32>>,
}

impl Matrix {
    /// Rows per segment: 8192 × 384 × 4 B = 12 MiB, enough segments at 1M rows (123) to
    /// balance any number of cores, few enough that merging their top-k lists is negligible.
    pub(crate) const SEGMENT_ROWS: usize = 8192;

    pub(crate) fn new(dim: usize) -> Self {
        Matrix { dim, len: 0, segments: Vec::new() }
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Full segments first, the last one possibly partial; each holds whole rows.
    pub(crate) fn segments(&self) -> &[Vec<f32>] {
        &self.segments
    }

    /// Appends a row (`row.len() == dim`, checked by the caller) and returns its index.
    pub(crate) fn push(&mut self, row: &[f32]) -> usize {
        debug_assert_eq!(row.len(), self.dim);
        if self.len.is_multiple_of(Self::SEGMENT_ROWS) {
            self.segments.push(Vec::new());
        }
        let last = self.segments.len() - 1;
        self.segments[last].extend_from_slice(row);
        self.len += 1;
        self.len - 1
    }

    #[inline]
    pub(crate) fn row(&self, row: usize) -> &[f32] {
        let (s, o) = (row / Self::SEGMENT_ROWS, row % Self::SEGMENT_ROWS);
        &self.segments[s][o * self.dim..(o + 1) * self.dim]
    }

    /// Reorders the rows in place so that row `i` becomes the former row `order[i]`
    /// (`order` a permutation of `0..len`). Follows the permutation's cycles with one row of
    /// scratch, so it needs no second copy of the matrix.
    pub(crate) fn permute(&mut self, order: &[u32]) {
        assert_eq!(order.len(), self.len);
        let dim = self.dim;
        let mut done = vec![false; self.len];
        let mut scratch = vec![0f32; dim];
        for start in 0..self.len {
            if done[start] || order[start] as usize == start {
                continue;
            }
            scratch.copy_from_slice(self.row(start));
            let mut to = start;
            loop {
                done[to] = true;
                let from = order[to] as usize;
                if from == start {
                    self.row_mut(to).copy_from_slice(&scratch);
                    break;
                }
                let (fs, fo) = (from / Self::SEGMENT_ROWS, from % Self::SEGMENT_ROWS);
                let (ts, to_o) = (to / Self::SEGMENT_ROWS, to % Self::SEGMENT_ROWS);
                if fs == ts {
                    self.segments[ts].copy_within(fo * dim..(fo + 1) * dim, to_o * dim);
                } else {
                    let (a, b) = (fs.min(ts), fs.max(ts));
                    let (head, tail) = self.segments.split_at_mut(b);
                    let (src, dst) = if fs < ts { (&head[a], &mut tail[0]) } else { (&tail[0], &mut head[a]) };
                    dst[to_o * dim..(to_o + 1) * dim].copy_from_slice(&src[fo * dim..(fo + 1) * dim]);
                }
                to = from;
            }
        }
    }

    fn row_mut(&mut self, row: usize) -> &mut [f32] {
        let (s, o) = (row / Self::SEGMENT_ROWS, row % Self::SEGMENT_ROWS);
        &mut self.segments[s][o * self.dim..(o + 1) * self.dim]
    }

    /// Removes `row` by moving the last row into its place. Returns the former index of the
    /// row that moved (`None` when `row` was the last one).
    pub(crate) fn swap_remove(&mut self, row: usize) -> Option<usize> {
        debug_assert!(row < self.len);
        let last = self.len - 1;
        let moved = if row != last {
            let (ls, lo) = (last / Self::SEGMENT_ROWS, last % Self::SEGMENT_ROWS);
            let (rs, ro) = (row / Self::SEGMENT_ROWS, row % Self::SEGMENT_ROWS);
            let dim = self.dim;
            if ls == rs {
                self.segments[rs].copy_within(lo * dim..(lo + 1) * dim, ro * dim);
            } else {
                let (head, tail) = self.segments.split_at_mut(ls);
                head[rs][ro * dim..(ro + 1) * dim].copy_from_slice(&tail[0][lo * dim..(lo + 1) * dim]);
            }
            Some(last)
        } else {
            None
        };
        let ls = last / Self::SEGMENT_ROWS;
        let new_len = self.segments[ls].len() - self.dim;
        self.segments[ls].truncate(new_len);
        if self.segments[ls].is_empty() {
            self.segments.pop();
        }
        self.len -= 1;
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_across_segments() {
        let n = Matrix::SEGMENT_ROWS * 2 + 5;
        let mut m = Matrix::new(3);
        for i in 0..n {
            m.push(&[i as f32, 0.5, -(i as f32)]);
        }
        // Reversal (long cycles across segments) composed with a rotation by 7.
        let order: Vec<u32> = (0..n).map(|i| ((n - 1 - i + 7) % n) as u32).collect();
        m.permute(&order);
        for (i, &from) in order.iter().enumerate() {
            assert_eq!(m.row(i), &[from as f32, 0.5, -(from as f32)]);
        }
    }

    #[test]
    fn swap_remove_across_segments_keeps_rows_dense() {
        let mut m = Matrix::new(2);
        let n = Matrix::SEGMENT_ROWS + 3;
        let mut model: Vec<[f32; 2]> = Vec::new();
        for i in 0..n {
            let r = [i as f32, -(i as f32)];
            m.push(&r);
            model.push(r);
        }
        // Remove from the first segment (last row lives in the second), from the last segment,
        // and the last row itself.
        for pick in [0, 1, 2, 3] {
            let row = match pick {
                0 => 0,
                1 => m.len() - 2,
                2 => 5,
                _ => m.len() - 1,
            };
            let moved = m.swap_remove(row);
            let was_last = model.len() - 1;
            model.swap_remove(row);
            assert_eq!(moved, (row != was_last).then_some(was_last));
        }
        assert_eq!(m.len(), model.len());
        for (i, r) in model.iter().enumerate() {
            assert_eq!(m.row(i), &r[..]);
        }
        // Emptying the second segment drops it.
        while m.len() > Matrix::SEGMENT_ROWS {
            m.swap_remove(m.len() - 1);
        }
        assert_eq!(m.segments().len(), 1);
        while !m.is_empty() {
            m.swap_remove(0);
        }
        assert!(m.segments().is_empty());
    }
}
