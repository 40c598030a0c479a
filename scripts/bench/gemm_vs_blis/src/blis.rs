//! BLIS through its CBLAS interface, for both programs of this benchmark.

use std::os::raw::{c_char, c_int};

use blis_src as _; // links libblis.a

const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_NO_TRANS: c_int = 111;
const CBLAS_TRANS: c_int = 112;

unsafe extern "C" {
    fn cblas_sgemm(
        order: c_int,
        trans_a: c_int,
        trans_b: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
    fn bli_info_get_version_str() -> *const c_char;
    fn bli_thread_get_num_threads() -> i64;
    fn bli_arch_query_id() -> c_int;
    fn bli_arch_string(id: c_int) -> *const c_char;
}

/// B is k×n row-major, or (bt) n×k row-major and used transposed.
pub fn sgemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], bt: bool, c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: row-major operands of the given shapes; BLAS ints are 32-bit (BLIS default).
    unsafe {
        cblas_sgemm(
            CBLAS_ROW_MAJOR,
            CBLAS_NO_TRANS,
            if bt { CBLAS_TRANS } else { CBLAS_NO_TRANS },
            m as c_int,
            n as c_int,
            k as c_int,
            1.0,
            a.as_ptr(),
            k as c_int,
            b.as_ptr(),
            if bt { k } else { n } as c_int,
            0.0,
            c.as_mut_ptr(),
            n as c_int,
        )
    }
}

/// BLIS version, the sub-configuration it dispatched to, and its thread count.
pub fn describe() -> (String, String, i64) {
    use std::ffi::CStr;
    // SAFETY: BLIS returns static NUL-terminated strings.
    unsafe {
        let v = CStr::from_ptr(bli_info_get_version_str()).to_string_lossy().into_owned();
        let arch = CStr::from_ptr(bli_arch_string(bli_arch_query_id())).to_string_lossy().into_owned();
        (v, arch, bli_thread_get_num_threads())
    }
}
