//! The ATTESTATION_REPORT decoder and its signature field, on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = attest::report::parse(data) {
        let _ = report.signature();
        let _ = report.reported_tcb();
        assert_eq!(report.signed_bytes().len(), attest::report::SIGNED_RANGE.len());
    }
});
