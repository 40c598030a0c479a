//! A dense row-major `f32` matrix: the one tensor type that crosses crate seams.

use std::fmt;

/// Dense row-major `f32` matrix of shape `(rows, cols)`.
#[derive(Clone, PartialEq, Default)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

/// A buffer whose length does not match the shape it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("buffer of {len} elements cannot be a {rows}x{cols} matrix")]
pub struct ShapeError {
    pub rows: usize,
    pub cols: usize,
    pub len: usize,
}

impl Matrix {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self { rows, cols, data: vec![0.0; rows * cols] }
    }

    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, ShapeError> {
        if data.len() != rows * cols {
            return Err(ShapeError { rows, cols, len: data.len() });
        }
        Ok(Self { rows, cols, data })
    }

    /// Builds a matrix element by element.
    pub fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> f32) -> Self {
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                data.push(f(r, c));
            }
        }
        Self { rows, cols, data }
    }

    /// Stacks matrices with equal column counts on top of each other.
    pub fn vstack<'a>(parts: impl IntoIterator<Item = &'a Matrix>) -> Result<Self, ShapeError> {
        let mut out: Option<Matrix> = None;
        for p in parts {
            match &mut out {
                None => out = Some(p.clone()),
                Some(o) => {
                    if o.cols != p.cols {
                        return Err(ShapeError { rows: p.rows, cols: o.cols, len: p.data.len() });
                    }
                    o.data.extend_from_slice(&p.data);
                    o.rows += p.rows;
                }
            }
        }
        Ok(out.unwrap_or_default())
    }

    /// Appends rows (a multiple of `cols` elements) at the bottom.
    pub fn push_rows(&mut self, rows: &[f32]) {
        assert!(self.cols > 0 && rows.len().is_multiple_of(self.cols), "push_rows: partial row");
        self.data.extend_from_slice(rows);
        self.rows += rows.len() / self.cols;
    }

    /// Drops every row from `rows` on.
    pub fn truncate_rows(&mut self, rows: usize) {
        if rows < self.rows {
            self.rows = rows;
            self.data.truncate(rows * self.cols);
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Rows `start..end` as a new matrix.
    pub fn slice_rows(&self, start: usize, end: usize) -> Matrix {
        Matrix { rows: end - start, cols: self.cols, data: self.data[start * self.cols..end * self.cols].to_vec() }
    }

    pub fn get(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.cols + c]
    }

    pub fn set(&mut self, r: usize, c: usize, v: f32) {
        self.data[r * self.cols + c] = v;
    }

    /// True when no element is NaN or infinite.
    pub fn is_finite(&self) -> bool {
        self.rows_finite(0)
    }

    /// Whether rows `from..` are finite (none when `from` is past the end).
    pub fn rows_finite(&self, from: usize) -> bool {
        // An exponent of all ones (NaN or ±inf) is the largest value `bits & EXP` can take:
        // a max per chunk is branch-free and vectorizes to packed maxima; this runs on every
        // linear's input.
        const EXP: u32 = 0x7f80_0000;
        let finite =
            |d: &[f32]| d.chunks(1024).all(|c| c.iter().fold(0u32, |acc, v| acc.max(v.to_bits() & EXP)) != EXP);
        let data = &self.data[(from * self.cols).min(self.data.len())..];
        // A prefill's or a batch's activations are tens of megabytes: one core scanning them
        // before every product is a serial stretch on many cores.
        if data.len() < crate::cpu::PAR_COPY_MIN {
            return finite(data);
        }
        let bad = std::sync::atomic::AtomicBool::new(false);
        crate::pool::global().for_ranges(data.len(), 1 << 16, &|r| {
            if !finite(&data[r]) {
                bad.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        !bad.into_inner()
    }

    pub fn transpose(&self) -> Matrix {
        let mut out = Matrix::zeros(self.cols, self.rows);
        for r in 0..self.rows {
            for c in 0..self.cols {
                out.data[c * self.rows + r] = self.data[r * self.cols + c];
            }
        }
        out
    }

    /// Frobenius norm, accumulated in f64.
    pub fn frobenius(&self) -> f64 {
        self.data.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt()
    }

    /// `‖self − other‖_F / ‖other‖_F`.
    pub fn rel_err(&self, other: &Matrix) -> f64 {
        assert_eq!(self.shape(), other.shape(), "rel_err of different shapes");
        let num: f64 = self
            .data
            .iter()
            .zip(&other.data)
            .map(|(&a, &b)| {
                let d = a as f64 - b as f64;
                d * d
            })
            .sum::<f64>()
            .sqrt();
        num / other.frobenius().max(f64::MIN_POSITIVE)
    }

    /// Overwrites the buffer with zeros (used to scrub mask material and plaintext).
    pub fn scrub(&mut self) {
        for v in self.data.iter_mut() {
            // Volatile so the compiler cannot elide the wipe of a buffer about to be freed.
            unsafe { std::ptr::write_volatile(v, 0.0) };
        }
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
}

impl fmt::Debug for Matrix {
    // Never print contents: a matrix may hold plaintext activations.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Matrix({}x{})", self.rows, self.cols)
    }
}

#[cfg(test)]
mod tests {
    use super::Matrix;

    /// NaN, ±inf and the largest finite values on both sides of a 1024-value chunk edge.
    #[test]
    fn finiteness_finds_every_non_finite_value_and_only_those() {
        let m = Matrix::from_fn(3, 700, |r, c| (r * 700 + c) as f32 - 1000.0);
        assert!(m.is_finite() && m.rows_finite(1) && m.rows_finite(3) && m.rows_finite(9));
        for at in [0, 1023, 1024, 2099] {
            let mut big = m.clone();
            big.as_mut_slice()[at] = f32::MAX;
            assert!(big.is_finite(), "f32::MAX at {at}");
            big.as_mut_slice()[at] = -f32::MIN_POSITIVE / 2.0;
            assert!(big.is_finite(), "subnormal at {at}");
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
                let mut x = m.clone();
                x.as_mut_slice()[at] = bad;
                assert!(!x.is_finite(), "{bad} at {at}");
                // Rows from the bad value's own row on see it; rows after it do not.
                assert!(!x.rows_finite(at / 700), "{bad} at {at}");
                assert!(x.rows_finite(at / 700 + 1), "{bad} at {at}");
            }
        }
    }

    /// Matrices large enough to be scanned in parallel pieces find a bad value in any piece.
    #[test]
    fn finiteness_of_large_matrices_sees_every_piece() {
        let m = Matrix::from_fn(600, 1000, |r, c| ((r * 1000 + c) % 977) as f32 - 400.0);
        assert!(m.is_finite() && m.rows_finite(300));
        for at in [0, 65_535, 65_536, 299_999, 300_000, 599_999] {
            let mut x = m.clone();
            x.as_mut_slice()[at] = f32::NAN;
            assert!(!x.is_finite(), "NaN at {at}");
            assert_eq!(x.rows_finite(300), at < 300_000, "NaN at {at}, rows from 300");
        }
    }
}

/// A borrowed row-major matrix: a product an engine lends out of its own memory (for the
/// Vulkan engine, the mapped read-back buffer) instead of copying it out.
#[derive(Clone, Copy)]
pub struct MatrixView<'a> {
    rows: usize,
    cols: usize,
    data: &'a [f32],
}

impl<'a> MatrixView<'a> {
    /// Views `data` as a `rows × cols` matrix.
    pub fn new(rows: usize, cols: usize, data: &'a [f32]) -> Result<Self, ShapeError> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(ShapeError { rows, cols, len: data.len() });
        }
        Ok(MatrixView { rows, cols, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    pub fn as_slice(&self) -> &'a [f32] {
        self.data
    }

    pub fn row(&self, r: usize) -> &'a [f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

impl fmt::Debug for MatrixView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MatrixView({}x{})", self.rows, self.cols)
    }
}

impl Matrix {
    /// This matrix as a borrowed view.
    pub fn view(&self) -> MatrixView<'_> {
        MatrixView { rows: self.rows, cols: self.cols, data: &self.data }
    }
}
