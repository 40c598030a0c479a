//! Revocation, offline: the chain against the CRLs the policy lists.
//!
//! AMD's KDS publishes one CRL per product, issued and signed by the ARK (RSASSA-PSS,
//! SHA-384), listing revoked ASKs. A CRL applies to the certificates its issuer signed: one
//! whose issuer is the chain's ARK covers the ARK and the ASK, one whose issuer is the ASK
//! covers the VCEK. CRLs issued by neither (another product's) are skipped. Once the policy
//! lists any CRL, the chain's ARK must have issued one of them: otherwise a chain of a
//! product the CRLs forgot would pass unchecked.

use std::time::{Duration, SystemTime};

use x509_cert::Certificate;
use x509_cert::crl::TbsCertList;
use x509_cert::der::Encode;
use x509_cert::der::referenced::OwnedToRef;

use super::{CertRole, VerifyError};
use crate::policy::LoadedCrl;

/// RSASSA-PSS, the only algorithm AMD signs certificates and CRLs with.
const RSA_SSA_PSS: x509_cert::der::oid::ObjectIdentifier =
    x509_cert::der::oid::ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.10");

/// Checks the chain against `crls`. `now` is `None` when the policy does not check dates
/// (`check_certificate_validity: false`): then a CRL's update window is not checked either.
pub(super) fn check(
    crls: &[LoadedCrl],
    ark: &Certificate,
    ask: &Certificate,
    vcek: &Certificate,
    now: Option<SystemTime>,
) -> Result<(), VerifyError> {
    if crls.is_empty() {
        return Ok(());
    }
    let mut ark_issued_one = false;
    for crl in crls {
        let tbs = &crl.list.tbs_cert_list;
        let (issuer, covered): (&Certificate, &[(&Certificate, CertRole)]) =
            if tbs.issuer == ark.tbs_certificate.subject {
                ark_issued_one = true;
                (ark, &[(ark, CertRole::Ark), (ask, CertRole::Ask)])
            } else if tbs.issuer == ask.tbs_certificate.subject {
                (ask, &[(vcek, CertRole::Vcek)])
            } else {
                continue;
            };
        check_crl(crl, issuer, now)?;
        for (cert, which) in covered {
            if is_listed(tbs, cert) {
                return Err(VerifyError::CertificateRevoked {
                    which: *which,
                    serial: hex::encode(cert.tbs_certificate.serial_number.as_bytes()),
                    crl: crl.name.clone(),
                });
            }
        }
    }
    if !ark_issued_one {
        return Err(VerifyError::CrlMissing(ark.tbs_certificate.subject.to_string()));
    }
    Ok(())
}

/// The CRL is signed by its issuer's key and, when dates are checked, current.
fn check_crl(crl: &LoadedCrl, issuer: &Certificate, now: Option<SystemTime>) -> Result<(), VerifyError> {
    let invalid = |detail: String| VerifyError::CrlInvalid(format!("{}: {detail}", crl.name));
    let list = &crl.list;
    let tbs = &list.tbs_cert_list;
    // As for certificates: the unsigned outer algorithm must equal the signed inner one.
    if list.signature_algorithm != tbs.signature {
        return Err(invalid("signatureAlgorithm differs from tbsCertList.signature".into()));
    }
    if list.signature_algorithm.oid != RSA_SSA_PSS {
        return Err(invalid(format!("signature algorithm {} is not RSASSA-PSS", list.signature_algorithm.oid)));
    }
    let message = tbs.to_der().map_err(|e| invalid(format!("tbsCertList does not encode: {e}")))?;
    rsa_pss_sha384_verify(issuer, &message, list.signature.raw_bytes())
        .map_err(|e| invalid(format!("not signed by the {}: {e}", issuer.tbs_certificate.subject)))?;

    let Some(now) = now else { return Ok(()) };
    let now = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or(Duration::ZERO);
    if now < tbs.this_update.to_unix_duration() {
        return Err(invalid(format!("thisUpdate {} is in the future", tbs.this_update)));
    }
    // RFC 5280 requires nextUpdate; without it nothing says how stale the list may be.
    let next_update = tbs.next_update.ok_or_else(|| invalid("no nextUpdate".into()))?;
    if now > next_update.to_unix_duration() {
        return Err(VerifyError::CrlExpired { crl: crl.name.clone(), next_update: next_update.to_string() });
    }
    Ok(())
}

/// RSASSA-PSS with SHA-384, MGF1-SHA-384 and a 48-byte salt: the same verification `sev`
/// applies to the chain's certificates (`sev::certs::snp::Verifiable`).
fn rsa_pss_sha384_verify(signer: &Certificate, message: &[u8], signature: &[u8]) -> Result<(), String> {
    use rsa::signature::Verifier as _;
    let spki = signer.tbs_certificate.subject_public_key_info.owned_to_ref();
    let key = rsa::RsaPublicKey::try_from(spki).map_err(|e| format!("issuer key is not RSA: {e}"))?;
    let signature = rsa::pss::Signature::try_from(signature).map_err(|e| format!("signature: {e}"))?;
    rsa::pss::VerifyingKey::<sha2::Sha384>::new(key).verify(message, &signature).map_err(|e| e.to_string())
}

fn is_listed(tbs: &TbsCertList, cert: &Certificate) -> bool {
    let serial = &cert.tbs_certificate.serial_number;
    tbs.revoked_certificates.iter().flatten().any(|r| &r.serial_number == serial)
}
