//! Certificate parsing: AMD VCEK extensions and RA-TLS certificates, on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use x509_cert::der::Decode;

fuzz_target!(|data: &[u8]| {
    if let Ok(cert) = x509_cert::Certificate::from_der(data) {
        let _ = attest::amd::vcek_extensions(&cert);
    }
    let _ = attest::ratls::evidence_from_certificate(data);
});
