//! The type that marks what may cross to the untrusted device.
//!
//! Engines accept only [`Masked`] operands, and only this crate makes one: from activations
//! it has mixed with a secret mask (`U = A·H`), or from a product the engine returned,
//! which the engine has seen already. Everything else that wants to hand an engine an
//! operand (the plaintext parity baseline, engine tests and benchmarks, the attack
//! harness's control condition) must call [`danger::expose_plaintext`] by name, so a
//! plaintext activation cannot reach a GPU by accident.

use tensor::{Matrix, MatrixView};

/// An operand that is safe to reveal to the untrusted engine.
pub struct Masked(Matrix);

impl Masked {
    /// Wraps a matrix this crate has mixed with secret mask material, or a product the
    /// engine returned.
    pub(crate) fn mixed(m: Matrix) -> Self {
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

    pub fn view(&self) -> MatrixView<'_> {
        self.0.view()
    }
}

impl std::fmt::Debug for Masked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Masked({}x{})", self.0.rows(), self.0.cols())
    }
}

/// A row-major operand over `Z_{2^32}` for the engine's ring products: int8 activations
/// plus a dual-LPN mask (`x + e·H`), or the public code `H` itself. Only this crate makes
/// one, like [`Masked`].
pub struct RingMasked {
    rows: usize,
    cols: usize,
    data: Vec<u32>,
}

impl RingMasked {
    pub(crate) fn new(rows: usize, cols: usize, data: Vec<u32>) -> Self {
        assert_eq!(data.len(), rows * cols, "ring operand shape");
        RingMasked { rows, cols, data }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.data
    }
}

impl std::fmt::Debug for RingMasked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingMasked({}x{})", self.rows, self.cols)
    }
}

/// Ways around the boundary. Each use is a deliberate opt-out of confidentiality.
pub mod danger {
    use super::*;

    /// Sends plaintext to the engine. Only the plaintext parity baseline, tests and
    /// benchmarks of the engines themselves, and the attack harness's control condition
    /// may call this.
    pub fn expose_plaintext(m: Matrix) -> Masked {
        Masked(m)
    }

    /// Sends a plaintext ring operand to the engine (engine tests and benchmarks only).
    pub fn expose_ring(rows: usize, cols: usize, data: Vec<u32>) -> RingMasked {
        RingMasked::new(rows, cols, data)
    }
}
