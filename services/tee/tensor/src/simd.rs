//! Runtime CPU-feature dispatch for hand-written hot loops.
//!
//! The default x86-64 target only guarantees SSE2. [`simd_dispatch!`] compiles a function
//! body three times — with AVX-512 (F, BW, DQ, VL), with AVX2+FMA, and for the baseline —
//! and picks at run time, so binaries stay portable while loops vectorize 16- or 8-wide
//! where the CPU allows.

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
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                if $crate::simd::has_avx512() {
                    // SAFETY: the CPU supports the features `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
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

/// Whether the AVX-512 paths of [`simd_dispatch!`] can run on this CPU (AVX2 and FMA
/// included; cached by the standard library).
#[inline]
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
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

/// `eˣ` to within 2 ulp for the finite range of f32 (Cephes' `expf`: `x = k·ln2 + r`, a
/// degree-6 polynomial in `r`, `2ᵏ` put into the exponent bits), written without calls or
/// branches so that loops over it vectorize: libm's `expf` is a call per element.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.33, 88.37);
    let k = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - k * 0.693_359_4 + k * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// `erf(x)` to within 3·10⁻⁷, branch-free: below |x| = 0.5 its Taylor series to x¹⁵
/// (where `1 − …` would cancel), above it Abramowitz & Stegun 7.1.26 (1.5·10⁻⁷) with
/// [`exp`]; the select compiles to a blend.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152) * t + 1.421_413_8) * t - 0.284_496_74) * t + 0.254_829_6) * t;
    let large = 1.0 - poly * exp(-a * a);
    let z = a * a;
    let series = a
        * std::f32::consts::FRAC_2_SQRT_PI
        * (1.0
            + z * (-1.0 / 3.0
                + z * (1.0 / 10.0 + z * (-1.0 / 42.0 + z * (1.0 / 216.0 + z * (-1.0 / 1320.0 + z * (1.0 / 9360.0)))))));
    (if a < 0.5 { series } else { large }).copysign(x)
}

simd_dispatch! {
    /// Exact GELU, `x·Φ(x) = x/2·(1 + erf(x/√2))`, in place (BERT's `gelu`).
    pub fn gelu(x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

simd_dispatch! {
    /// The largest of `scale·x` (−∞ for an empty slice), in sixteen lanes so that it
    /// vectorizes.
    pub fn max_scaled(x: &[f32], scale: f32) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; 16];
        let chunks = x.chunks_exact(16);
        let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v * scale));
        for c in chunks {
            for k in 0..16 {
                lanes[k] = lanes[k].max(c[k] * scale);
            }
        }
        lanes.iter().fold(tail, |m, &l| m.max(l))
    }
}

/// `e^d`, and exactly 0 below f32's range (a masked score, `−∞`, included): [`exp`] clamps
/// there instead.
#[inline(always)]
fn exp_or_zero(d: f32) -> f32 {
    let e = exp(d);
    if d < -87.33 { 0.0 } else { e }
}

simd_dispatch! {
    /// `x ← e^(scale·x − shift)`, returning the sum of the new values (sixteen partial
    /// sums, so the loop vectorizes; libm's `expf` would be a call per element).
    pub fn exp_shifted(x: &mut [f32], scale: f32, shift: f32) -> f32 {
        let mut lanes = [0.0f32; 16];
        let mut chunks = x.chunks_exact_mut(16);
        for c in &mut chunks {
            for k in 0..16 {
                c[k] = exp_or_zero(c[k] * scale - shift);
                lanes[k] += c[k];
            }
        }
        let mut tail = 0.0;
        for v in chunks.into_remainder() {
            *v = exp_or_zero(*v * scale - shift);
            tail += *v;
        }
        lanes.iter().sum::<f32>() + tail
    }
}

simd_dispatch! {
    /// `silu(gate) ⊙ up` into `gate` (SwiGLU).
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + exp(-*g)) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_and_erf_are_within_their_bounds() {
        for i in -20000..=20000 {
            let x = i as f32 * 0.004;
            let e = super::exp(x) as f64;
            let want = (x as f64).exp();
            assert!((e - want).abs() <= 3e-7 * want, "exp({x}) = {e}, want {want}");
            let f = super::erf(x) as f64;
            let want = libm::erf(x as f64);
            assert!((f - want).abs() <= 3e-7, "erf({x}) = {f}, want {want}");
        }
        assert_eq!(super::exp(-200.0), super::exp(-87.33));
        assert!(super::exp(200.0).is_finite());
        let mut g = vec![-3.0f32, -0.5, 0.0, 0.7, 4.0];
        super::gelu(&mut g);
        for (v, x) in g.iter().zip([-3.0f64, -0.5, 0.0, 0.7, 4.0]) {
            let want = 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
            assert!((*v as f64 - want).abs() < 1e-6, "gelu({x})");
        }
    }

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
