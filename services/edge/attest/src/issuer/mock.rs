//! The mock AMD-SP: a software PKI shaped exactly like AMD's (ARK and ASK RSA-4096 signing
//! with RSASSA-PSS/SHA-384, a P-384 VCEK carrying AMD's TCB and hwID extensions) and reports
//! signed over bytes 0x000–0x29F with ECDSA P-384, as the AMD-SP does.
//!
//! It proves nothing about the host: it exists so that everything downstream (verifier,
//! RA-TLS, operator) runs the real code path without SEV hardware. Its root is persisted
//! so other processes and a Kubernetes Secret can trust it explicitly; nothing trusts it
//! by default. It also signs CRLs shaped like the KDS's ([`MockPki::crl`]), to test
//! revocation offline.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use p384::pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _};
use rsa::RsaPrivateKey;
use rsa::rand_core::{OsRng, RngCore};
use rsa::signature::{RandomizedSigner, SignatureEncoding};
use sev::firmware::guest::{AttestationReport, GuestPolicy, KeyInfo, PlatformInfo, Version};
use sev::firmware::host::TcbVersion;
use sev::parser::ByteParser;
use sha2::{Digest, Sha256, Sha384};
use x509_cert::crl::{CertificateList, RevokedCert, TbsCertList};
use x509_cert::der::asn1::{BitString, GeneralizedTime, Ia5StringRef, OctetString, OctetStringRef, UtcTime};
use x509_cert::der::oid::AssociatedOid;
use x509_cert::der::pem::LineEnding;
use x509_cert::der::{Decode, Encode, EncodePem};
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::{AuthorityKeyIdentifier, BasicConstraints, KeyUsage, KeyUsages, SubjectKeyIdentifier};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::{DynSignatureAlgorithmIdentifier, SubjectPublicKeyInfoOwned};
use x509_cert::time::{Time, Validity};
use x509_cert::{Certificate, TbsCertificate, Version as X509Version};

use super::{IssuedReport, ReportIssuer};
use crate::amd::{self, oid};
use crate::error::{AttestError, Result};
use crate::evidence::{CertChain, IssuerKind};
use crate::report::{self, REPORT_LEN, SIG_ALGO_ECDSA_P384_SHA384, Tcb};
use crate::verify::MOCK_ORGANIZATION;

const RSA_BITS: usize = 4096;
/// ARK/ASK lifetime, like AMD's (25 years); VCEKs get 7, also like AMD's.
const CA_LIFETIME: Duration = Duration::from_secs(25 * 365 * 86_400);
const VCEK_LIFETIME: Duration = Duration::from_secs(7 * 365 * 86_400);
/// Backdating absorbs clock skew between the issuing and the verifying host.
const BACKDATE: Duration = Duration::from_secs(86_400);
/// How long a mock CRL stays current.
const CRL_LIFETIME: Duration = Duration::from_secs(30 * 86_400);

/// The TCB the mock VCEK is issued for, roughly a current Genoa platform.
pub const DEFAULT_TCB: Tcb = Tcb { bootloader: 10, tee: 0, snp: 23, microcode: 84 };
/// CPUID family/model/stepping the mock reports (Genoa), which tells parsers the TCB layout.
const CPUID: (u8, u8, u8) = (0x19, 0x11, 0x01);
/// Firmware version the mock reports as current and committed.
const FIRMWARE: (u8, u8, u8) = (1, 55, 38);

const FILE_ARK: &str = "ark.pem";
const FILE_ASK: &str = "ask.pem";
const FILE_VCEK: &str = "vcek.pem";
const FILE_ASK_KEY: &str = "ask-key.pem";
const FILE_VCEK_KEY: &str = "vcek-key.pem";
/// Optional: the launch digest `MockIssuer::load_or_create` reports (96 hex digits).
pub const FILE_MEASUREMENT: &str = "measurement.hex";

/// The launch digest reported when none is configured: SHA-384 of a fixed label, so a
/// policy can name it without guessing.
pub fn default_mock_measurement() -> [u8; 48] {
    Sha384::digest(b"gelo/mock-launch-digest/v1").into()
}

/// A VCEK and its private key.
struct MockVcek {
    der: Vec<u8>,
    key: p384::ecdsa::SigningKey,
    tcb: Tcb,
    chip_id: [u8; 64],
}

/// The mock certificate authority. The ASK's key is kept (and saved) so VCEKs for other
/// TCBs can be minted. The ARK's key is never saved: a freshly generated PKI keeps it in
/// memory to sign CRLs, a loaded one has none.
pub struct MockPki {
    ark_der: Vec<u8>,
    ark_key: Option<RsaPrivateKey>,
    ask_der: Vec<u8>,
    ask_key: RsaPrivateKey,
    vcek: Arc<MockVcek>,
}

/// One of the mock's two certificate authorities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MockCa {
    Ark,
    Ask,
}

/// A CRL for [`MockPki::crl`] to sign.
#[derive(Clone, Debug)]
pub struct MockCrl {
    /// The CA the CRL names as its issuer (AMD's KDS CRLs are the ARK's).
    pub issuer: MockCa,
    /// The CA whose key signs it: the issuer's, or another one for a CRL a verifier must
    /// refuse.
    pub signer: MockCa,
    pub revoked: Vec<SerialNumber>,
    pub this_update: SystemTime,
    pub next_update: Option<SystemTime>,
}

impl MockCrl {
    /// A CRL issued and signed by `issuer`, current from a day ago for 30 days.
    pub fn new(issuer: MockCa, revoked: Vec<SerialNumber>) -> Self {
        let now = SystemTime::now();
        Self { issuer, signer: issuer, revoked, this_update: now - BACKDATE, next_update: Some(now + CRL_LIFETIME) }
    }
}

impl std::fmt::Debug for MockPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockPki").field("root", &self.root_fingerprint()).finish_non_exhaustive()
    }
}

impl MockPki {
    /// Generates a fresh PKI. Two RSA-4096 key generations: seconds to tens of seconds, so
    /// persist it ([`Self::load_or_create`]) and reuse it.
    pub fn generate() -> Result<Self> {
        let ark_key = rsa_key()?;
        let ask_key = rsa_key()?;
        let now = SystemTime::now();
        let ark_name = amd_name("ARK-Mock-Genoa")?;
        let ask_name = amd_name("SEV-Mock-Genoa")?;
        let ark_spki = rsa_spki(&ark_key)?;
        let ark_ski = key_id(&ark_spki)?;
        let ark_der = sign_cert(
            &ark_key,
            ark_name.clone(),
            ark_name.clone(),
            ark_spki,
            validity(now, CA_LIFETIME)?,
            vec![
                ext(&KeyUsage(KeyUsages::KeyCertSign | KeyUsages::CRLSign), true)?,
                ext(&SubjectKeyIdentifier(ark_ski.clone()), false)?,
                ext(&BasicConstraints { ca: true, path_len_constraint: None }, true)?,
            ],
        )?;
        let ask_spki = rsa_spki(&ask_key)?;
        let ask_der = sign_cert(
            &ark_key,
            ark_name,
            ask_name,
            ask_spki.clone(),
            validity(now, CA_LIFETIME)?,
            vec![
                ext(&SubjectKeyIdentifier(key_id(&ask_spki)?), false)?,
                ext(
                    &AuthorityKeyIdentifier {
                        key_identifier: Some(ark_ski),
                        authority_cert_issuer: None,
                        authority_cert_serial_number: None,
                    },
                    false,
                )?,
                ext(&BasicConstraints { ca: true, path_len_constraint: Some(0) }, true)?,
                ext(&KeyUsage(KeyUsages::KeyCertSign.into()), true)?,
            ],
        )?;
        let mut chip_id = [0u8; 64];
        OsRng.fill_bytes(&mut chip_id);
        // A v2 report decoder calls an all-zero or mostly-zero CHIP_ID masked or Turin-like.
        chip_id[63] |= 1;
        let vcek = Arc::new(mint_vcek(&ask_key, &ask_der, DEFAULT_TCB, chip_id, HwId::Present, VCEK_LIFETIME)?);
        Ok(Self { ark_der, ark_key: Some(ark_key), ask_der, ask_key, vcek })
    }

    /// Signs a CRL (DER) as `spec` says. Signing with the ARK needs a PKI generated in this
    /// process: its key is never saved, so a loaded PKI refuses.
    pub fn crl(&self, spec: &MockCrl) -> Result<Vec<u8>> {
        let name_of = |ca: MockCa| -> Result<Name> {
            let der = match ca {
                MockCa::Ark => &self.ark_der,
                MockCa::Ask => &self.ask_der,
            };
            Ok(Certificate::from_der(der)
                .map_err(|e| AttestError::crypto("CA certificate", e))?
                .tbs_certificate
                .subject)
        };
        let signer = match spec.signer {
            MockCa::Ark => self.ark_key.as_ref().ok_or_else(|| AttestError::MockPki {
                path: PathBuf::new(),
                detail: "this PKI was loaded and has no ARK key (it is never saved): generate one to sign ARK CRLs"
                    .into(),
            })?,
            MockCa::Ask => &self.ask_key,
        };
        let key = rsa::pss::SigningKey::<Sha384>::new(signer.clone());
        let algorithm = key.signature_algorithm_identifier().map_err(|e| AttestError::crypto("PSS parameters", e))?;
        let revoked_at = der_time(spec.this_update)?;
        let revoked: Vec<RevokedCert> = spec
            .revoked
            .iter()
            .map(|serial| RevokedCert {
                serial_number: serial.clone(),
                revocation_date: revoked_at,
                crl_entry_extensions: None,
            })
            .collect();
        let tbs = TbsCertList {
            version: X509Version::V2,
            signature: algorithm.clone(),
            issuer: name_of(spec.issuer)?,
            this_update: der_time(spec.this_update)?,
            next_update: spec.next_update.map(der_time).transpose()?,
            revoked_certificates: (!revoked.is_empty()).then_some(revoked),
            crl_extensions: None,
        };
        let tbs_der = tbs.to_der().map_err(|e| AttestError::crypto("TBS CRL", e))?;
        let signature =
            key.try_sign_with_rng(&mut OsRng, &tbs_der).map_err(|e| AttestError::crypto("PSS signature", e))?;
        let crl = CertificateList {
            tbs_cert_list: tbs,
            signature_algorithm: algorithm,
            signature: BitString::from_bytes(&signature.to_vec()).map_err(|e| AttestError::crypto("signature", e))?,
        };
        crl.to_der().map_err(|e| AttestError::crypto("CRL", e))
    }

    fn mint_vcek(&self, tcb: Tcb, chip_id: [u8; 64], hw_id: HwId) -> Result<MockVcek> {
        mint_vcek(&self.ask_key, &self.ask_der, tcb, chip_id, hw_id, VCEK_LIFETIME)
    }

    pub fn ark_der(&self) -> &[u8] {
        &self.ark_der
    }
    pub fn ask_der(&self) -> &[u8] {
        &self.ask_der
    }
    pub fn vcek_der(&self) -> &[u8] {
        &self.vcek.der
    }
    pub fn chip_id(&self) -> [u8; 64] {
        self.vcek.chip_id
    }

    /// The root in PEM, for a policy's `mock_pem` or a Kubernetes Secret.
    pub fn ark_pem(&self) -> String {
        to_pem(&self.ark_der).unwrap_or_default()
    }

    /// SHA-256 of the root's DER, to compare roots at a glance.
    pub fn root_fingerprint(&self) -> String {
        hex::encode(Sha256::digest(&self.ark_der))
    }

    /// Writes the PKI into `dir` (created if needed). Private keys get mode 0600.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let err = |e: std::io::Error| AttestError::io(dir, e);
        std::fs::create_dir_all(dir).map_err(err)?;
        let pem = |der: &[u8]| to_pem(der);
        let ask_key = self.ask_key.to_pkcs8_pem(LineEnding::LF).map_err(|e| AttestError::crypto("ASK key", e))?;
        let vcek_key = self.vcek.key.to_pkcs8_pem(LineEnding::LF).map_err(|e| AttestError::crypto("VCEK key", e))?;
        write_file(&dir.join(FILE_ASK_KEY), ask_key.as_bytes(), true)?;
        write_file(&dir.join(FILE_VCEK_KEY), vcek_key.as_bytes(), true)?;
        write_file(&dir.join(FILE_ASK), pem(&self.ask_der)?.as_bytes(), false)?;
        write_file(&dir.join(FILE_VCEK), pem(&self.vcek.der)?.as_bytes(), false)?;
        // The root goes last: its presence marks a complete PKI for `load`.
        write_file(&dir.join(FILE_ARK), pem(&self.ark_der)?.as_bytes(), false)
    }

    /// Loads a PKI written by [`Self::save`].
    pub fn load(dir: &Path) -> Result<Self> {
        let bad = |detail: String| AttestError::MockPki { path: dir.to_owned(), detail };
        let read = |name: &str| std::fs::read(dir.join(name)).map_err(|e| AttestError::io(dir.join(name), e));
        let cert = |name: &str| -> Result<Vec<u8>> {
            crate::policy::pem_or_der(&read(name)?).map_err(|e| bad(format!("{name}: {e}")))
        };
        let ark_der = cert(FILE_ARK)?;
        let ask_der = cert(FILE_ASK)?;
        let vcek_der = cert(FILE_VCEK)?;
        let text =
            |name: &str| -> Result<String> { String::from_utf8(read(name)?).map_err(|e| bad(format!("{name}: {e}"))) };
        let ask_key =
            RsaPrivateKey::from_pkcs8_pem(&text(FILE_ASK_KEY)?).map_err(|e| bad(format!("{FILE_ASK_KEY}: {e}")))?;
        let vcek_key = p384::ecdsa::SigningKey::from_pkcs8_pem(&text(FILE_VCEK_KEY)?)
            .map_err(|e| bad(format!("{FILE_VCEK_KEY}: {e}")))?;
        let vcek_cert = Certificate::from_der(&vcek_der).map_err(|e| bad(format!("{FILE_VCEK}: {e}")))?;
        let ext = amd::vcek_extensions(&vcek_cert).map_err(|e| bad(format!("{FILE_VCEK}: {e}")))?;
        let chip_id: Option<[u8; 64]> = ext.hw_id.as_deref().and_then(|id| id.try_into().ok());
        let (Some(bootloader), Some(tee), Some(snp), Some(microcode), Some(chip_id)) =
            (ext.bootloader, ext.tee, ext.snp, ext.microcode, chip_id)
        else {
            return Err(bad(format!("{FILE_VCEK} lacks AMD TCB or 64-byte hwID extensions")));
        };
        let spki = vcek_cert.tbs_certificate.subject_public_key_info.subject_public_key.as_bytes().unwrap_or_default();
        if vcek_key.verifying_key().to_encoded_point(false).as_bytes() != spki {
            return Err(bad(format!("{FILE_VCEK_KEY} does not match {FILE_VCEK}")));
        }
        let tcb = Tcb { bootloader, tee, snp, microcode };
        Ok(Self {
            ark_der,
            ark_key: None,
            ask_der,
            ask_key,
            vcek: Arc::new(MockVcek { der: vcek_der, key: vcek_key, tcb, chip_id }),
        })
    }

    /// Loads the PKI in `dir`, or generates and persists one. Safe against other processes
    /// doing the same: the PKI is built in a sibling folder and renamed into place, and the
    /// loser of a race loads the winner's.
    pub fn load_or_create(dir: &Path) -> Result<Self> {
        if dir.join(FILE_ARK).exists() {
            return Self::load(dir);
        }
        tracing::info!(dir = %dir.display(), "generating mock SEV-SNP PKI (two RSA-4096 keys; once)");
        let pki = Self::generate()?;
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| AttestError::io(parent, e))?;
        let staging = parent.join(format!(
            ".{}.tmp-{}-{}",
            dir.file_name().and_then(|n| n.to_str()).unwrap_or("mock-pki"),
            std::process::id(),
            OsRng.next_u64()
        ));
        pki.save(&staging)?;
        // rename(2) succeeds onto a missing or empty folder, and fails if another process
        // already put a PKI there.
        match std::fs::rename(&staging, dir) {
            Ok(()) => Ok(pki),
            Err(_) => {
                let _ = std::fs::remove_dir_all(&staging);
                if dir.join(FILE_ARK).exists() {
                    return Self::load(dir);
                }
                // A non-empty folder without a PKI (e.g. `--out` pointing at a used folder).
                pki.save(dir)?;
                Ok(pki)
            }
        }
    }
}

/// Report settings of the mock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockSettings {
    /// MEASUREMENT: the launch digest.
    pub measurement: [u8; 48],
    /// Sets the guest policy's DEBUG bit (a verifier should refuse it).
    pub debug: bool,
    /// Sets the guest policy's MIGRATE_MA bit.
    pub migrate_ma: bool,
    pub vmpl: u32,
    /// 2, 3 or 5. Version 3 and later carry the CPUID fields.
    pub report_version: u32,
    pub host_data: [u8; 32],
    pub guest_svn: u32,
}

impl Default for MockSettings {
    fn default() -> Self {
        Self {
            measurement: default_mock_measurement(),
            debug: false,
            migrate_ma: false,
            vmpl: 0,
            report_version: 3,
            host_data: [0; 32],
            guest_svn: 0,
        }
    }
}

/// Issues mock reports. Cheap to clone.
#[derive(Clone)]
pub struct MockIssuer {
    pki: Arc<MockPki>,
    vcek: Arc<MockVcek>,
    settings: MockSettings,
}

impl std::fmt::Debug for MockIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockIssuer").field("pki", &self.pki).field("settings", &self.settings).finish()
    }
}

impl MockIssuer {
    pub fn new(pki: Arc<MockPki>) -> Self {
        let vcek = pki.vcek.clone();
        Self { pki, vcek, settings: MockSettings::default() }
    }

    /// [`MockPki::load_or_create`], reporting the launch digest in `dir/measurement.hex`
    /// when that file exists.
    pub fn load_or_create(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let issuer = Self::new(Arc::new(MockPki::load_or_create(dir)?));
        let path: PathBuf = dir.join(FILE_MEASUREMENT);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(issuer.with_measurement(super::parse_hex::<48>("measurement.hex", &text)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(issuer),
            Err(e) => Err(AttestError::io(path, e)),
        }
    }

    pub fn with_measurement(mut self, measurement: [u8; 48]) -> Self {
        self.settings.measurement = measurement;
        self
    }

    pub fn with_settings(mut self, settings: MockSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Reports at another TCB, with a VCEK minted for it (one RSA signature by the ASK).
    pub fn with_tcb(mut self, tcb: Tcb) -> Result<Self> {
        self.vcek = Arc::new(self.pki.mint_vcek(tcb, self.vcek.chip_id, HwId::Present)?);
        Ok(self)
    }

    /// Reports signed by a VCEK minted without AMD's hwID extension (as a VLEK is), so
    /// nothing in the chain names the chip: for testing a verifier's `require_vcek_hwid`.
    pub fn with_vcek_without_hwid(mut self) -> Result<Self> {
        self.vcek = Arc::new(self.pki.mint_vcek(self.vcek.tcb, self.vcek.chip_id, HwId::Omitted)?);
        Ok(self)
    }

    /// Reports signed by a new VCEK whose certificate expires `lifetime` from now (to the
    /// second): for testing what a verifier does when evidence stops being valid while its
    /// service runs.
    pub fn with_vcek_expiring_in(mut self, lifetime: Duration) -> Result<Self> {
        let (ask_key, ask_der) = (&self.pki.ask_key, &self.pki.ask_der);
        self.vcek = Arc::new(mint_vcek(ask_key, ask_der, self.vcek.tcb, self.vcek.chip_id, HwId::Present, lifetime)?);
        Ok(self)
    }

    pub fn settings(&self) -> &MockSettings {
        &self.settings
    }
    pub fn pki(&self) -> &Arc<MockPki> {
        &self.pki
    }
    pub fn tcb(&self) -> Tcb {
        self.vcek.tcb
    }

    /// The chain this issuer's reports verify against.
    pub fn chain(&self) -> CertChain {
        CertChain {
            ark_der: self.pki.ark_der.clone(),
            ask_der: self.pki.ask_der.clone(),
            vcek_der: self.vcek.der.clone(),
        }
    }

    fn report(&self, report_data: [u8; 64]) -> Result<[u8; REPORT_LEN]> {
        let s = &self.settings;
        let t = self.vcek.tcb;
        let tcb = TcbVersion::new(None, t.bootloader, t.tee, t.snp, t.microcode);
        // Reserved bit 17 is set by `From<u64>`; SMT allowed (bit 16) like a typical launch.
        let policy_bits = (1u64 << 16) | (u64::from(s.migrate_ma) << 18) | (u64::from(s.debug) << 19);
        let mut report_id = [0u8; 32];
        OsRng.fill_bytes(&mut report_id);
        let v3 = s.report_version >= 3;
        let v5 = s.report_version >= 5;
        let firmware = Version::new(FIRMWARE.0, FIRMWARE.1, FIRMWARE.2);
        let r = AttestationReport {
            version: s.report_version,
            guest_svn: s.guest_svn,
            policy: GuestPolicy::from(policy_bits),
            family_id: [0; 16],
            image_id: [0; 16],
            vmpl: s.vmpl,
            sig_algo: SIG_ALGO_ECDSA_P384_SHA384,
            current_tcb: tcb,
            plat_info: PlatformInfo::from(1),
            key_info: KeyInfo::default(),
            report_data,
            measurement: s.measurement,
            host_data: s.host_data,
            id_key_digest: [0; 48],
            author_key_digest: [0; 48],
            report_id,
            // All ones: no migration agent, as the AMD-SP reports it.
            report_id_ma: [0xff; 32],
            reported_tcb: tcb,
            cpuid_fam_id: v3.then_some(CPUID.0),
            cpuid_mod_id: v3.then_some(CPUID.1),
            cpuid_step: v3.then_some(CPUID.2),
            chip_id: self.vcek.chip_id,
            committed_tcb: tcb,
            current: firmware,
            committed: firmware,
            launch_tcb: tcb,
            launch_mit_vector: v5.then_some(0),
            current_mit_vector: v5.then_some(0),
            signature: Default::default(),
        };
        let mut bytes: [u8; REPORT_LEN] = r.to_bytes().map_err(|e| AttestError::Report(e.to_string()))?;
        use p384::ecdsa::signature::Signer as _;
        let signature: p384::ecdsa::Signature = self.vcek.key.sign(&bytes[report::SIGNED_RANGE]);
        report::write_signature(&mut bytes, &signature);
        Ok(bytes)
    }
}

impl ReportIssuer for MockIssuer {
    fn kind(&self) -> IssuerKind {
        IssuerKind::Mock
    }

    fn issue(&self, report_data: [u8; 64]) -> Result<IssuedReport> {
        Ok(IssuedReport { report: self.report(report_data)?.to_vec(), chain: self.chain() })
    }
}

/// Whether a minted VCEK carries the hwID extension (AMD's always do).
#[derive(Clone, Copy, PartialEq, Eq)]
enum HwId {
    Present,
    Omitted,
}

/// A VCEK for `tcb` on chip `chip_id`, signed by the ASK like AMD's KDS would.
fn mint_vcek(
    ask_key: &RsaPrivateKey,
    ask_der: &[u8],
    tcb: Tcb,
    chip_id: [u8; 64],
    hw_id_ext: HwId,
    lifetime: Duration,
) -> Result<MockVcek> {
    let key = p384::ecdsa::SigningKey::random(&mut OsRng);
    let spki =
        SubjectPublicKeyInfoOwned::from_key(*key.verifying_key()).map_err(|e| AttestError::crypto("VCEK key", e))?;
    let ask = Certificate::from_der(ask_der).map_err(|e| AttestError::crypto("ASK", e))?;
    let int = |v: u8| v.to_der();
    let ext_der = |oid, value: std::result::Result<Vec<u8>, x509_cert::der::Error>| -> Result<Extension> {
        Ok(Extension {
            extn_id: oid,
            critical: false,
            extn_value: OctetString::new(value.map_err(|e| AttestError::crypto("VCEK extension", e))?)
                .map_err(|e| AttestError::crypto("VCEK extension", e))?,
        })
    };
    let product = Ia5StringRef::new("Genoa").and_then(|s| s.to_der());
    let hw_id = OctetStringRef::new(&chip_id).and_then(|s| s.to_der());
    // Same extensions, same order and same encodings as a VCEK from AMD's KDS.
    let mut extensions = vec![
        ext_der(oid::STRUCT_VERSION, int(0))?,
        ext_der(oid::PRODUCT_NAME, product)?,
        ext_der(oid::BOOTLOADER_SPL, int(tcb.bootloader))?,
        ext_der(oid::TEE_SPL, int(tcb.tee))?,
        ext_der(oid::SPL_4, int(0))?,
        ext_der(oid::SPL_5, int(0))?,
        ext_der(oid::SPL_6, int(0))?,
        ext_der(oid::SPL_7, int(0))?,
        ext_der(oid::SNP_SPL, int(tcb.snp))?,
        ext_der(oid::UCODE_SPL, int(tcb.microcode))?,
    ];
    if hw_id_ext == HwId::Present {
        extensions.push(ext_der(oid::HW_ID, hw_id)?);
    }
    let der = sign_cert(
        ask_key,
        ask.tbs_certificate.subject.clone(),
        amd_name("SEV-VCEK")?,
        spki,
        validity(SystemTime::now(), lifetime)?,
        extensions,
    )?;
    Ok(MockVcek { der, key, tcb, chip_id })
}

// --- certificate plumbing ---

fn rsa_key() -> Result<RsaPrivateKey> {
    RsaPrivateKey::new(&mut OsRng, RSA_BITS).map_err(|e| AttestError::crypto("RSA key generation", e))
}

fn rsa_spki(key: &RsaPrivateKey) -> Result<SubjectPublicKeyInfoOwned> {
    SubjectPublicKeyInfoOwned::from_key(key.to_public_key()).map_err(|e| AttestError::crypto("RSA public key", e))
}

/// Key identifier: first 20 bytes of SHA-256 of the SPKI (RFC 7093 method 1).
fn key_id(spki: &SubjectPublicKeyInfoOwned) -> Result<OctetString> {
    let der = spki.to_der().map_err(|e| AttestError::crypto("SPKI", e))?;
    OctetString::new(&Sha256::digest(der)[..20]).map_err(|e| AttestError::crypto("key identifier", e))
}

/// AMD's subject layout (OU, C, L, ST, O, CN), with an organization that says "mock".
fn amd_name(cn: &str) -> Result<Name> {
    format!("CN={cn},O={MOCK_ORGANIZATION},ST=CA,L=Santa Clara,C=US,OU=Engineering")
        .parse()
        .map_err(|e| AttestError::crypto("certificate name", e))
}

fn der_time(t: SystemTime) -> Result<Time> {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or(Duration::ZERO);
    // RFC 5280: UTCTime through 2049, GeneralizedTime after.
    UtcTime::from_unix_duration(since)
        .map(Time::UtcTime)
        .or_else(|_| GeneralizedTime::from_unix_duration(since).map(Time::GeneralTime))
        .map_err(|e| AttestError::crypto("certificate time", e))
}

fn validity(now: SystemTime, lifetime: Duration) -> Result<Validity> {
    Ok(Validity { not_before: der_time(now - BACKDATE)?, not_after: der_time(now + lifetime)? })
}

fn ext<T: AssociatedOid + Encode>(value: &T, critical: bool) -> Result<Extension> {
    let der = value.to_der().map_err(|e| AttestError::crypto("extension", e))?;
    Ok(Extension {
        extn_id: T::OID,
        critical,
        extn_value: OctetString::new(der).map_err(|e| AttestError::crypto("extension", e))?,
    })
}

/// Signs a certificate with RSASSA-PSS (SHA-384, MGF1-SHA-384, 48-byte salt), as AMD does.
fn sign_cert(
    signer: &RsaPrivateKey,
    issuer: Name,
    subject: Name,
    spki: SubjectPublicKeyInfoOwned,
    validity: Validity,
    extensions: Vec<Extension>,
) -> Result<Vec<u8>> {
    let key = rsa::pss::SigningKey::<Sha384>::new(signer.clone());
    let algorithm = key.signature_algorithm_identifier().map_err(|e| AttestError::crypto("PSS parameters", e))?;
    let mut serial = [0u8; 8];
    OsRng.fill_bytes(&mut serial);
    serial[0] = (serial[0] & 0x7f) | 0x01; // positive, minimal encoding
    let tbs = TbsCertificate {
        version: X509Version::V3,
        serial_number: SerialNumber::new(&serial).map_err(|e| AttestError::crypto("serial", e))?,
        signature: algorithm.clone(),
        issuer,
        validity,
        subject,
        subject_public_key_info: spki,
        issuer_unique_id: None,
        subject_unique_id: None,
        extensions: Some(extensions),
    };
    let tbs_der = tbs.to_der().map_err(|e| AttestError::crypto("TBS certificate", e))?;
    let signature = key.try_sign_with_rng(&mut OsRng, &tbs_der).map_err(|e| AttestError::crypto("PSS signature", e))?;
    let cert = Certificate {
        tbs_certificate: tbs,
        signature_algorithm: algorithm,
        signature: BitString::from_bytes(&signature.to_vec()).map_err(|e| AttestError::crypto("signature", e))?,
    };
    cert.to_der().map_err(|e| AttestError::crypto("certificate", e))
}

fn to_pem(der: &[u8]) -> Result<String> {
    Certificate::from_der(der).and_then(|c| c.to_pem(LineEnding::LF)).map_err(|e| AttestError::crypto("PEM", e))
}

fn write_file(path: &Path, bytes: &[u8], private: bool) -> Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut f = options.open(path).map_err(|e| AttestError::io(path, e))?;
    f.write_all(bytes).map_err(|e| AttestError::io(path, e))
}
