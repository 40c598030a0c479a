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

/// Ways around the boundary. Each use is a deliberate opt-out of confidentiality.
pub mod danger {
    use super::*;

    /// Sends plaintext to the engine. Only the plaintext parity baseline, tests and
    /// benchmarks of the engines themselves, and the attack harness's control condition
    /// may call this.
    pub fn expose_plaintext(m: Matrix) -> Masked {
        Masked(m)
    }
}
