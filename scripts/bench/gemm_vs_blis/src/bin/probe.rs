//! Per-call times of one 256×384×384 product for 3 s after a process starts, on two
//! threads: BLIS (run with BLIS_NUM_THREADS=2) or `gemm` with `Parallelism::Rayon(2)`.
//!
//! usage: probe <blis|gemm>        prints the median and max of every 0.25 s window
//!        PROBE_SUMMARY=1 probe …  prints one line: calls, median, calls over 4 ms

use std::time::Instant;

#[allow(dead_code)] // `describe` is the benchmark's
#[path = "../blis.rs"]
mod blis;

fn main() {
    let lib = std::env::args().nth(1).expect("usage: probe <blis|gemm>");
    assert!(lib == "blis" || lib == "gemm", "usage: probe <blis|gemm>");
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global().unwrap();
    let summary = std::env::var_os("PROBE_SUMMARY").is_some();
    let (m, k, n) = (256usize, 384usize, 384usize);
    let (a, b, mut c) = (vec![0.5f32; m * k], vec![0.25f32; k * n], vec![0.0f32; m * n]);
    let t0 = Instant::now();
    let (mut all, mut window, mut last) = (Vec::new(), Vec::new(), 0.0);
    while t0.elapsed().as_secs_f64() < 3.0 {
        let t = Instant::now();
        if lib == "blis" {
            blis::sgemm(m, k, n, &a, &b, false, &mut c);
        } else {
            let p = gemm::Parallelism::Rayon(2);
            let (ki, ni) = (k as isize, n as isize);
            // SAFETY: row-major operands of the given shapes; `c` is exclusive.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    ni,
                    false,
                    a.as_ptr(),
                    1,
                    ki,
                    b.as_ptr(),
                    1,
                    ni,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    p,
                )
            }
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        all.push(ms);
        window.push(ms);
        let now = t0.elapsed().as_secs_f64();
        if !summary && now - last >= 0.25 {
            window.sort_by(f64::total_cmp);
            let (med, max) = (window[window.len() / 2], window[window.len() - 1]);
            print!("[{now:.2} s: {} calls, median {med:.2} ms, max {max:.1}] ", window.len());
            window.clear();
            last = now;
        }
    }
    let slow: Vec<f64> = all.iter().copied().filter(|&t| t > 4.0).collect();
    all.sort_by(f64::total_cmp);
    if summary {
        let stalled = slow.iter().fold(0.0, |s, t| s + t) / 1e3;
        println!(
            "{lib}: {} calls, median {:.2} ms, {} calls over 4 ms ({stalled:.2} s of 3 s)",
            all.len(),
            all[all.len() / 2],
            slow.len()
        );
    } else {
        println!();
    }
}
