//! What a report's REPORT_DATA commits to: the model, the protocol settings, the service's
//! TLS key and a verifier-chosen nonce. Both the issuer and the verifier compute it here,
//! so the two sides cannot drift apart.

use sha2::{Digest, Sha256, Sha512};

use crate::error::{AttestError, Result};

/// Domain separator of REPORT_DATA (see `proto/gelo/v1/attestation.proto`).
pub const REPORT_DATA_DOMAIN: &[u8] = b"gelo/report-data/v1";

/// The nonce bound into the evidence a service embeds in its RA-TLS certificate at start.
/// That evidence is not fresh on its own; freshness comes from `Attestation.GetEvidence`.
pub const STARTUP_NONCE: [u8; 32] = [0; 32];

/// Nonces longer than this are refused: REPORT_DATA hashes them, but an unbounded nonce is
/// an unbounded allocation on the issuing side.
pub const MAX_NONCE_LEN: usize = 64;

/// Everything REPORT_DATA binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub model_identity: [u8; 32],
    pub scheme_identity: [u8; 32],
    pub tls_spki_sha256: [u8; 32],
    pub nonce: Vec<u8>,
}

/// `SHA-512("gelo/report-data/v1" || model_identity || scheme_identity || tls_spki_sha256 || nonce)`.
///
/// Every field but the last has a fixed width, so the concatenation is unambiguous.
pub fn report_data(binding: &Binding) -> [u8; 64] {
    let mut h = Sha512::new();
    h.update(REPORT_DATA_DOMAIN);
    h.update(binding.model_identity);
    h.update(binding.scheme_identity);
    h.update(binding.tls_spki_sha256);
    h.update(&binding.nonce);
    h.finalize().into()
}

/// SHA-256 of the canonical form of `scheme_json`: keys sorted at every level, no
/// whitespace. Two spellings of the same settings get the same identity.
pub fn scheme_identity(scheme_json: &str) -> Result<[u8; 32]> {
    Ok(Sha256::digest(canonical_json(scheme_json)?.as_bytes()).into())
}

/// The canonical spelling hashed by [`scheme_identity`].
///
/// Written by hand rather than relying on `serde_json::Map` ordering: another crate in the
/// build may turn on serde_json's `preserve_order`, which would silently change the hash.
pub fn canonical_json(scheme_json: &str) -> Result<String> {
    let value: serde_json::Value =
        serde_json::from_str(scheme_json).map_err(|e| AttestError::SchemeJson(e.to_string()))?;
    let mut out = String::with_capacity(scheme_json.len());
    write_canonical(&value, &mut out);
    Ok(out)
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                // A JSON string's own serialization is already canonical (serde_json escapes
                // the minimal set), so reuse it for keys.
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// SHA-256 of a DER `SubjectPublicKeyInfo`: how a TLS key is named in REPORT_DATA.
pub fn spki_sha256(spki_der: &[u8]) -> [u8; 32] {
    Sha256::digest(spki_der).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> Binding {
        Binding { model_identity: [1; 32], scheme_identity: [2; 32], tls_spki_sha256: [3; 32], nonce: vec![4; 32] }
    }

    #[test]
    fn report_data_matches_the_proto_definition() {
        let b = binding();
        let mut concat = REPORT_DATA_DOMAIN.to_vec();
        concat.extend_from_slice(&[1; 32]);
        concat.extend_from_slice(&[2; 32]);
        concat.extend_from_slice(&[3; 32]);
        concat.extend_from_slice(&[4; 32]);
        let expected: [u8; 64] = Sha512::digest(&concat).into();
        assert_eq!(report_data(&b), expected);
    }

    #[test]
    fn every_binding_field_changes_report_data() {
        let base = report_data(&binding());
        let mut b = binding();
        b.model_identity[31] ^= 1;
        assert_ne!(report_data(&b), base);
        let mut b = binding();
        b.scheme_identity[0] ^= 1;
        assert_ne!(report_data(&b), base);
        let mut b = binding();
        b.tls_spki_sha256[7] ^= 1;
        assert_ne!(report_data(&b), base);
        let mut b = binding();
        b.nonce.push(0);
        assert_ne!(report_data(&b), base);
    }

    #[test]
    fn scheme_identity_ignores_whitespace_and_key_order() {
        let a = r#"{"mask":"haar","shield":{"k":8,"energy":4.0},"role":"embedder"}"#;
        let b = "{ \"role\" : \"embedder\",\n \"shield\": {\"energy\": 4.0, \"k\": 8}, \"mask\": \"haar\" }";
        assert_eq!(scheme_identity(a).unwrap(), scheme_identity(b).unwrap());
        assert_eq!(canonical_json(b).unwrap(), r#"{"mask":"haar","role":"embedder","shield":{"energy":4.0,"k":8}}"#);
    }

    #[test]
    fn scheme_identity_sees_value_changes() {
        let a = scheme_identity(r#"{"k":8}"#).unwrap();
        let b = scheme_identity(r#"{"k":9}"#).unwrap();
        let c = scheme_identity(r#"{"k":"8"}"#).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn invalid_scheme_json_is_a_typed_error() {
        assert!(matches!(scheme_identity("{not json"), Err(AttestError::SchemeJson(_))));
    }
}
