//! The hidden-input corpus of evidence: valid mock evidence with each field replaced by what
//! a hostile peer could send (empty, one byte short or long, all zeros, all ones, another
//! field's bytes, forged DER lengths, deep or huge JSON), and its protobuf encoding with
//! forged lengths and tags, cut at many points. Every variant must be refused with one of
//! the verifier's stable reasons — none accepted, none panicking — and the counts are printed.

use attest::{Evidence, Verifier, verify::REASONS};

use super::common::*;

/// DER headers forged in place: a certificate's first bytes hold its tag and length.
fn forged_der(der: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![vec![], vec![0x30], der[..der.len() / 2].to_vec(), der[..der.len() - 1].to_vec()];
    let mut longer = der.to_vec();
    longer.push(0);
    out.push(longer);
    for at in 0..der.len().min(48) {
        for v in [0x00, 0x01, 0x7f, 0x80, 0x81, 0x84, 0xff] {
            if der[at] != v {
                let mut d = der.to_vec();
                d[at] = v;
                out.push(d);
            }
        }
    }
    // An indefinite length and a length of 2^32 - 1 on the outer SEQUENCE.
    out.push([&[0x30, 0x80][..], &der[2..], &[0, 0]].concat());
    out.push([&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff][..], &der[4..]].concat());
    out
}

/// Every field of `e` replaced, one at a time, by hostile values.
fn field_variants(e: &Evidence) -> Vec<Evidence> {
    let mut out = Vec::new();
    let mut with = |f: &dyn Fn(&mut Evidence)| {
        let mut v = e.clone();
        f(&mut v);
        out.push(v);
    };
    let len = e.report.len();
    for report in [
        vec![],
        vec![0; 1],
        vec![0; len],
        vec![0xff; len],
        e.report[..len - 1].to_vec(),
        [&e.report[..], &[0]].concat(),
    ] {
        with(&|v| v.report = report.clone());
    }
    for der in forged_der(&e.vcek_der) {
        with(&|v| v.vcek_der = der.clone());
    }
    for der in forged_der(&e.ask_der) {
        with(&|v| v.ask_der = der.clone());
    }
    for der in forged_der(&e.ark_der) {
        with(&|v| v.ark_der = der.clone());
    }
    with(&|v| std::mem::swap(&mut v.ark_der, &mut v.vcek_der));
    with(&|v| v.ask_der = v.ark_der.clone());
    for nonce in [vec![], vec![0; 31], vec![0; 33], vec![0xff; 4096]] {
        with(&|v| v.nonce = nonce.clone());
    }
    for role in ["", "gateway", "EMBEDDER", "embedder\0", &"r".repeat(1 << 16)] {
        with(&|v| v.role = role.to_string());
    }
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for scheme in ["", "{", "null", "{\"role\":\"embedder\",\"role\":\"generator\"}", &deep, &"x".repeat(1 << 20)] {
        with(&|v| v.scheme_json = scheme.to_string());
    }
    with(&|v| v.model_identity = [0; 32]);
    with(&|v| v.scheme_identity = [0xff; 32]);
    with(&|v| v.tls_spki_sha256[0] ^= 1);
    with(&|v| v.issuer = attest::IssuerKind::SevSnp);
    out
}

/// The encoding with forged bytes: each of the first 256 positions and every 61st after
/// set to the values that forge protobuf tags and varint lengths; and cut at many points.
fn encoded_variants(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let positions = (0..bytes.len().min(256)).chain((256..bytes.len()).step_by(61));
    for at in positions {
        for v in [0x00, 0x08, 0x7f, 0x80, 0xff] {
            let mut b = bytes.to_vec();
            b[at] = v;
            out.push(b);
        }
    }
    for cut in (0..bytes.len()).step_by(37) {
        out.push(bytes[..cut].to_vec());
    }
    // A length varint claiming 2^63 bytes, and ten continuation bytes.
    out.push([&[0x0a][..], &[0xff; 9], &[0x7f], &bytes[..16]].concat());
    out.push([&[0x0a][..], &[0x80; 10], &bytes[..16]].concat());
    out
}

#[test]
fn hostile_evidence_corpus_is_refused_by_reason_never_accepted() {
    let e = evidence();
    let policy = policy();
    let verifier = Verifier::new();
    verifier.verify(&e, &expected(), &policy).expect("the unaltered evidence verifies");
    let fields = field_variants(&e);
    let mut reasons = std::collections::BTreeMap::<&str, usize>::new();
    for v in &fields {
        let err = verifier.verify(v, &expected(), &policy).expect_err("a hostile field was accepted");
        assert!(REASONS.contains(&err.reason()), "{err:?}");
        *reasons.entry(err.reason()).or_default() += 1;
    }
    let bytes = e.to_bytes();
    let encoded = encoded_variants(&bytes);
    let mut accepted_unchanged = 0;
    for b in &encoded {
        match verifier.verify_bytes(b, &expected(), &policy) {
            Err(err) => {
                assert!(REASONS.contains(&err.reason()), "{err:?}");
                *reasons.entry(err.reason()).or_default() += 1;
            }
            // A forged byte protobuf reads back as the same message (a redundant encoding)
            // may verify; anything else that verifies is a hole.
            Ok(_) => {
                let decoded = Evidence::from_bytes(b).expect("it verified, so it decodes");
                assert_eq!(decoded, e, "altered evidence verified");
                accepted_unchanged += 1;
            }
        }
    }
    eprintln!(
        "evidence corpus: {} field variants and {} encoded variants, {} refused ({accepted_unchanged} decoded to the \
         unaltered evidence), 0 panics; reasons {reasons:?}",
        fields.len(),
        encoded.len(),
        fields.len() + encoded.len() - accepted_unchanged
    );
    assert!(fields.len() > 400 && encoded.len() > 1000, "{} + {}", fields.len(), encoded.len());
}
