//! Helpers the store's integration tests share.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

/// A random unit vector of `dim` values.
pub fn unit(rng: &mut ChaCha8Rng, dim: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}
