//! Runtime CPU-feature dispatch for hand-written hot loops.
//!
//! The default x86-64 target only guarantees SSE2. [`simd_dispatch!`] compiles a function
//! body twice — once with AVX2+FMA enabled, once for the baseline — and picks at run time,
//! so binaries stay portable while loops vectorize 8-wide where the CPU allows.

/// Defines `fn $name(..)` whose body is compiled for AVX2+FMA and for the baseline, chosen
/// at run time. The body must be safe code; slices and scalars only.
#[macro_export]
macro_rules! simd_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports the features `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            generic($($arg),*)
        }
    };
}

/// Whether the AVX2+FMA paths can run on this CPU (cached by the standard library).
#[inline]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `Σ a_i·b_i` (over the shorter of the two).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA.
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

/// Portable dot product with eight independent accumulators.
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// AVX2+FMA dot product: four 8-lane accumulators, 32 elements per iteration.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (all loads): i + 32 ≤ n, resp. i + 8 ≤ n, keeps every read inside both slices.
    while i + 32 <= n {
        for (k, a_k) in acc.iter_mut().enumerate() {
            let (x, y) = unsafe { (_mm256_loadu_ps(pa.add(i + 8 * k)), _mm256_loadu_ps(pb.add(i + 8 * k))) };
            *a_k = _mm256_fmadd_ps(x, y, *a_k);
        }
        i += 32;
    }
    while i + 8 <= n {
        let (x, y) = unsafe { (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))) };
        acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        i += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0.0f32; 8];
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    let mut total: f32 = lanes.iter().sum();
    while i < n {
        total += a[i] * b[i];
        i += 1;
    }
    total
}

simd_dispatch! {
    /// `y ← y + a·x`.
    pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        for (yi, &xi) in y.iter_mut().zip(x) {
            *yi += a * xi;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dot_paths_agree() {
        for n in [0, 1, 7, 8, 31, 32, 33, 100, 577] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((super::dot(&a, &b) as f64 - exact).abs() < 1e-4, "n={n}");
            assert!((super::dot_portable(&a, &b) as f64 - exact).abs() < 1e-4, "n={n}");
        }
    }
}
