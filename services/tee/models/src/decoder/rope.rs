//! Rotary position embedding, in the Hugging Face `rotate_half` layout every decoder
//! family here uses; applied in the TEE to queries and keys before they are cached.

/// Rotary position embedding in the Hugging Face `rotate_half` layout: inside each head,
/// element `i` rotates with `i + rot/2` by `pos·θ^(−2i/rot)`.
pub struct Rope {
    inv_freq: Vec<f32>,
    rot: usize,
}

impl Rope {
    pub fn new(theta: f32, rot: usize) -> Self {
        // Computed in f32 as transformers does, so positions match its rounding.
        let inv_freq = (0..rot / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / rot as f32)).collect();
        Rope { inv_freq, rot }
    }

    /// The rotation of positions `pos0..pos0 + n`, computed once for all heads and layers
    /// of a forward pass.
    pub fn at(&self, pos0: usize, n: usize) -> RopeAngles {
        let half = self.rot / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
        for t in 0..n {
            for &f in &self.inv_freq {
                let (s, c) = ((pos0 + t) as f32 * f).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        RopeAngles { cos, sin, half }
    }
}

/// `cos` and `sin` of every rotation angle at some positions (see [`Rope::at`]).
pub struct RopeAngles {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RopeAngles {
    /// Rotates one head vector at the `t`-th of the positions.
    pub fn rotate(&self, t: usize, head: &mut [f32]) {
        let h = self.half;
        let (cos, sin) = (&self.cos[t * h..(t + 1) * h], &self.sin[t * h..(t + 1) * h]);
        let (lo, hi) = head[..2 * h].split_at_mut(h);
        for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(cos).zip(sin) {
            let (x, y) = (*a, *b);
            *a = x * c - y * s;
            *b = y * c + x * s;
        }
    }
}
