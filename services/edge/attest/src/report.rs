//! The SEV-SNP ATTESTATION_REPORT (AMD SEV-SNP ABI spec, table "ATTESTATION_REPORT
//! Structure"): its layout, the signed range, and the raw signature.
//!
//! Field values are decoded by the virtee `sev` crate. The signature is checked here over
//! the bytes as received, not over `sev`'s re-encoding: re-encoding drops reserved bytes, so
//! a flipped reserved byte would otherwise go unnoticed.

use std::ops::Range;

use sev::firmware::guest::AttestationReport;
use sev::parser::ByteParser;

use crate::rejection::VerifyError;

/// Size of an ATTESTATION_REPORT.
pub const REPORT_LEN: usize = 1184;
/// The AMD-SP signs bytes `0x000..0x2A0`.
pub const SIGNED_RANGE: Range<usize> = 0x000..0x2A0;
/// Signature field: R (72 bytes, little-endian, zero-padded), S (same), 368 reserved bytes.
pub const SIGNATURE_OFFSET: usize = 0x2A0;
const SCALAR_FIELD_LEN: usize = 72;
const SCALAR_LEN: usize = 48;
/// SIGNATURE_ALGO value for ECDSA P-384 with SHA-384, the only one AMD defines.
pub const SIG_ALGO_ECDSA_P384_SHA384: u32 = 1;

/// Every region of the report by name, in order, covering all 1184 bytes. Tests flip each
/// one; docs point at it.
pub const FIELDS: &[(&str, Range<usize>)] = &[
    ("version", 0x000..0x004),
    ("guest_svn", 0x004..0x008),
    ("policy", 0x008..0x010),
    ("family_id", 0x010..0x020),
    ("image_id", 0x020..0x030),
    ("vmpl", 0x030..0x034),
    ("signature_algo", 0x034..0x038),
    ("current_tcb", 0x038..0x040),
    ("platform_info", 0x040..0x048),
    ("key_info", 0x048..0x04C),
    ("reserved_04c", 0x04C..0x050),
    ("report_data", 0x050..0x090),
    ("measurement", 0x090..0x0C0),
    ("host_data", 0x0C0..0x0E0),
    ("id_key_digest", 0x0E0..0x110),
    ("author_key_digest", 0x110..0x140),
    ("report_id", 0x140..0x160),
    ("report_id_ma", 0x160..0x180),
    ("reported_tcb", 0x180..0x188),
    ("cpuid", 0x188..0x18B),
    ("reserved_18b", 0x18B..0x1A0),
    ("chip_id", 0x1A0..0x1E0),
    ("committed_tcb", 0x1E0..0x1E8),
    ("current_version", 0x1E8..0x1EC),
    ("committed_version", 0x1EC..0x1F0),
    ("launch_tcb", 0x1F0..0x1F8),
    ("mit_vectors", 0x1F8..0x208),
    ("reserved_208", 0x208..0x2A0),
    ("signature_r", 0x2A0..0x2E8),
    ("signature_s", 0x2E8..0x330),
    ("signature_reserved", 0x330..0x4A0),
];

/// The four security version numbers the VCEK is derived from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tcb {
    #[serde(default)]
    pub bootloader: u8,
    #[serde(default)]
    pub tee: u8,
    #[serde(default)]
    pub snp: u8,
    #[serde(default)]
    pub microcode: u8,
}

impl From<sev::firmware::host::TcbVersion> for Tcb {
    fn from(t: sev::firmware::host::TcbVersion) -> Self {
        Self { bootloader: t.bootloader, tee: t.tee, snp: t.snp, microcode: t.microcode }
    }
}

impl std::fmt::Display for Tcb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bootloader={} tee={} snp={} microcode={}", self.bootloader, self.tee, self.snp, self.microcode)
    }
}

/// A report that decoded; its signature is not checked yet.
pub struct ParsedReport<'a> {
    raw: &'a [u8],
    pub fields: AttestationReport,
}

/// Decodes a report. Never panics; wrong sizes and unknown layouts are typed errors.
pub fn parse(raw: &[u8]) -> Result<ParsedReport<'_>, VerifyError> {
    if raw.len() != REPORT_LEN {
        return Err(VerifyError::ReportLength { got: raw.len() });
    }
    let fields = AttestationReport::from_bytes(raw).map_err(|e| VerifyError::ReportMalformed(e.to_string()))?;
    Ok(ParsedReport { raw, fields })
}

impl ParsedReport<'_> {
    pub fn signed_bytes(&self) -> &[u8] {
        &self.raw[SIGNED_RANGE]
    }

    /// The ECDSA signature, after checking that every byte AMD defines as zero is zero
    /// (scalar padding and the reserved tail), so no byte of the field is malleable.
    pub fn signature(&self) -> Result<p384::ecdsa::Signature, VerifyError> {
        let field = &self.raw[SIGNATURE_OFFSET..];
        let (r, rest) = field.split_at(SCALAR_FIELD_LEN);
        let (s, reserved) = rest.split_at(SCALAR_FIELD_LEN);
        if r[SCALAR_LEN..].iter().chain(&s[SCALAR_LEN..]).chain(reserved).any(|&b| b != 0) {
            return Err(VerifyError::ReportSignatureMalformed("non-zero padding or reserved bytes".into()));
        }
        let be = |le: &[u8]| {
            let mut out = [0u8; SCALAR_LEN];
            for (o, b) in out.iter_mut().zip(le[..SCALAR_LEN].iter().rev()) {
                *o = *b;
            }
            out
        };
        p384::ecdsa::Signature::from_scalars(be(r), be(s))
            .map_err(|e| VerifyError::ReportSignatureMalformed(e.to_string()))
    }

    pub fn reported_tcb(&self) -> Tcb {
        self.fields.reported_tcb.into()
    }
}

/// Writes an ECDSA P-384 signature into a report the way the AMD-SP does: R and S
/// little-endian, each zero-padded to 72 bytes.
pub(crate) fn write_signature(report: &mut [u8; REPORT_LEN], signature: &p384::ecdsa::Signature) {
    let (r, s) = signature.split_bytes();
    let field = &mut report[SIGNATURE_OFFSET..];
    field.fill(0);
    for (i, b) in r.iter().rev().enumerate() {
        field[i] = *b;
    }
    for (i, b) in s.iter().rev().enumerate() {
        field[SCALAR_FIELD_LEN + i] = *b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_cover_the_whole_report_without_gaps() {
        let mut next = 0;
        for (name, range) in FIELDS {
            assert_eq!(range.start, next, "gap or overlap before {name}");
            next = range.end;
        }
        assert_eq!(next, REPORT_LEN);
    }

    #[test]
    fn wrong_lengths_are_typed_errors() {
        for len in [0, 1, REPORT_LEN - 1, REPORT_LEN + 1, 4096] {
            assert!(matches!(parse(&vec![0u8; len]), Err(VerifyError::ReportLength { got }) if got == len));
        }
    }

    #[test]
    fn unsupported_versions_are_typed_errors() {
        // Version 0 and 1 are refused by the decoder; all zeros also lacks a CPU family.
        assert!(matches!(parse(&[0u8; REPORT_LEN]), Err(VerifyError::ReportMalformed(_))));
    }
}
