//! The type that marks what may cross to the untrusted device.
//!
//! Engines accept and return only [`Masked`]. The protocol crate makes one from activations
//! it has mixed with a secret mask; the plaintext parity baseline must call
//! [`danger::expose_plaintext`] by name, so a plaintext activation cannot reach a GPU by
//! accident.

use crate::Matrix;

/// An operand that is safe to reveal to the untrusted engine.
pub struct Masked(Matrix);

impl Masked {
    /// Wraps a matrix that the caller has mixed with secret mask material
    /// (`U = A·H`, or a product the engine returned).
    pub fn from_mixed(m: Matrix) -> Self {
        Self(m)
    }

    pub fn matrix(&self) -> &Matrix {
        &self.0
    }

    pub fn into_matrix(self) -> Matrix {
        self.0
    }

    pub fn rows(&self) -> usize {
        self.0.rows()
    }

    pub fn cols(&self) -> usize {
        self.0.cols()
    }

    pub fn view(&self) -> MaskedView<'_> {
        MaskedView { rows: self.0.rows(), cols: self.0.cols(), data: self.0.as_slice() }
    }
}

/// A borrowed masked matrix (row-major): a product an engine lends out of its own memory
/// (for the Vulkan engine, the mapped read-back buffer) instead of copying it out.
#[derive(Clone, Copy)]
pub struct MaskedView<'a> {
    rows: usize,
    cols: usize,
    data: &'a [f32],
}

impl<'a> MaskedView<'a> {
    /// Views `data` as a `rows × cols` product the engine computed on masked operands.
    pub fn from_mixed(rows: usize, cols: usize, data: &'a [f32]) -> Result<Self, crate::ShapeError> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(crate::ShapeError { rows, cols, len: data.len() });
        }
        Ok(MaskedView { rows, cols, data })
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

impl std::fmt::Debug for MaskedView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MaskedView({}x{})", self.rows, self.cols)
    }
}

impl std::fmt::Debug for Masked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Masked({}x{})", self.0.rows(), self.0.cols())
    }
}

/// Ways around the boundary. Each use is a deliberate opt-out of confidentiality.
pub mod danger {
    use super::*;

    /// Sends plaintext to the engine. Only the plaintext parity baseline and the attack
    /// harness's control condition may call this.
    pub fn expose_plaintext(m: Matrix) -> Masked {
        Masked(m)
    }
}
