//! Why evidence was rejected. Each variant has a stable machine name ([`VerifyError::reason`])
//! for log fields, metric labels and a CRD status; the `Display` text is for humans.

/// Which certificate of the chain an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertRole {
    Ark,
    Ask,
    Vcek,
}

impl std::fmt::Display for CertRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ark => "ARK",
            Self::Ask => "ASK",
            Self::Vcek => "VCEK",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    // --- the evidence does not decode ---
    #[error("evidence does not decode: {0}")]
    EvidenceMalformed(String),
    #[error("report is {got} bytes, not 1184")]
    ReportLength { got: usize },
    #[error("report does not decode: {0}")]
    ReportMalformed(String),
    #[error("{which} certificate does not decode: {detail}")]
    CertificateMalformed { which: CertRole, detail: String },

    // --- the chain ---
    #[error("the chain's root is not a trusted AMD ARK nor a trusted mock root")]
    RootNotTrusted,
    #[error("the chain's root is a GELO mock root that this policy does not trust")]
    MockRootNotTrusted,
    #[error("the ARK is not self-signed: {0}")]
    ArkSelfSignatureInvalid(String),
    #[error("the ASK is not signed by the ARK: {0}")]
    AskSignatureInvalid(String),
    #[error("the VCEK is not signed by the ASK: {0}")]
    VcekSignatureInvalid(String),
    #[error("{which} certificate is not valid yet")]
    CertificateNotYetValid { which: CertRole },
    #[error("{which} certificate has expired")]
    CertificateExpired { which: CertRole },
    #[error("the VCEK does not hold a P-384 public key: {0}")]
    VcekKeyInvalid(String),
    #[error("the policy lists CRLs but none was issued by this chain's ARK ({0})")]
    CrlMissing(String),
    #[error("CRL unusable: {0}")]
    CrlInvalid(String),
    #[error("CRL {crl} is stale: its nextUpdate {next_update} has passed")]
    CrlExpired { crl: String, next_update: String },
    #[error("{which} certificate (serial {serial}) is revoked by CRL {crl}")]
    CertificateRevoked { which: CertRole, serial: String, crl: String },

    // --- the report's signature and its tie to the VCEK ---
    #[error("report signature algorithm {0} is not ECDSA P-384/SHA-384")]
    SignatureAlgorithmUnsupported(u32),
    #[error("report signature field is malformed: {0}")]
    ReportSignatureMalformed(String),
    #[error("the report is not signed by the VCEK")]
    ReportSignatureInvalid,
    #[error("the VCEK was issued for TCB {vcek}, the report says {report}")]
    VcekTcbMismatch { vcek: String, report: String },
    #[error("the VCEK was issued for another chip than the report's CHIP_ID")]
    VcekChipIdMismatch,
    #[error("the VCEK has no hwID extension, so nothing ties it to the report's chip")]
    VcekHwidMissing,

    // --- the claims and the binding ---
    #[error("evidence claims issuer {claimed} but its chain ends at a {proven} root")]
    IssuerKindMismatch { claimed: String, proven: String },
    #[error("scheme_json does not hash to scheme_identity")]
    SchemeJsonMismatch,
    #[error("role {claimed:?} differs from the role in scheme_json ({in_scheme:?})")]
    RoleMismatch { claimed: String, in_scheme: String },
    #[error("model identity differs from the expected one")]
    ModelIdentityMismatch,
    #[error("scheme identity differs from the expected one")]
    SchemeIdentityMismatch,
    #[error("evidence is bound to another TLS key than this connection's")]
    TlsKeyMismatch,
    #[error("the peer's TLS key {got} is not the pinned one ({pinned})")]
    TlsKeyNotPinned { got: String, pinned: String },
    #[error("evidence is bound to another nonce than the one sent")]
    NonceMismatch,
    #[error("REPORT_DATA does not commit to the claimed model, scheme, TLS key and nonce")]
    ReportDataMismatch,

    // --- policy ---
    #[error("report version {got} is older than the minimum {min}")]
    ReportVersionTooOld { got: u32, min: u32 },
    #[error("the guest policy allows debugging")]
    DebugNotAllowed,
    #[error("the guest policy allows a migration agent")]
    MigrationAgentNotAllowed,
    #[error("VMPL {0} is not allowed")]
    VmplNotAllowed(u32),
    #[error("TCB {component} is {got}, below the minimum {min}")]
    TcbTooLow { component: &'static str, got: u8, min: u8 },
    #[error("launch measurement {0} is not allowed")]
    MeasurementNotAllowed(String),
    #[error("chip {0} is not in the allowlist")]
    ChipIdNotAllowed(String),
    #[error("model identity {0} is not allowed")]
    ModelIdentityNotAllowed(String),
    #[error("scheme identity {0} is not allowed")]
    SchemeIdentityNotAllowed(String),
    #[error("role {0:?} is not allowed")]
    RoleNotAllowed(String),
    #[error("{role} runs protection {protection:?} (scheme field protocol.executor); the policy allows {allowed:?}")]
    ProtectionNotAllowed { role: String, protection: String, allowed: Vec<String> },
    #[error("{role} runs {field} = {value}; the policy allows {allowed}")]
    SchemeSettingNotAllowed { role: String, field: &'static str, value: String, allowed: String },
    #[error("the policy is unusable: {0}")]
    PolicyInvalid(String),
    /// The policy requires the release log and the measurement (or the log) failed it;
    /// the reason is the [`crate::release::ReleaseLogError`]'s own.
    #[error(transparent)]
    ReleaseLog(#[from] crate::release::ReleaseLogError),
}

impl VerifyError {
    /// Stable machine name: `snake_case`, never renamed once shipped.
    pub fn reason(&self) -> &'static str {
        use VerifyError::*;
        match self {
            EvidenceMalformed(_) => "evidence_malformed",
            ReportLength { .. } => "report_length",
            ReportMalformed(_) => "report_malformed",
            CertificateMalformed { .. } => "certificate_malformed",
            RootNotTrusted => "root_not_trusted",
            MockRootNotTrusted => "mock_root_not_trusted",
            ArkSelfSignatureInvalid(_) => "ark_self_signature_invalid",
            AskSignatureInvalid(_) => "ask_signature_invalid",
            VcekSignatureInvalid(_) => "vcek_signature_invalid",
            CertificateNotYetValid { .. } => "certificate_not_yet_valid",
            CertificateExpired { .. } => "certificate_expired",
            VcekKeyInvalid(_) => "vcek_key_invalid",
            CrlMissing(_) => "crl_missing",
            CrlInvalid(_) => "crl_invalid",
            CrlExpired { .. } => "crl_expired",
            CertificateRevoked { .. } => "certificate_revoked",
            SignatureAlgorithmUnsupported(_) => "signature_algorithm_unsupported",
            ReportSignatureMalformed(_) => "report_signature_malformed",
            ReportSignatureInvalid => "report_signature_invalid",
            VcekTcbMismatch { .. } => "vcek_tcb_mismatch",
            VcekChipIdMismatch => "vcek_chip_id_mismatch",
            VcekHwidMissing => "vcek_hwid_missing",
            IssuerKindMismatch { .. } => "issuer_kind_mismatch",
            SchemeJsonMismatch => "scheme_json_mismatch",
            RoleMismatch { .. } => "role_mismatch",
            ModelIdentityMismatch => "model_identity_mismatch",
            SchemeIdentityMismatch => "scheme_identity_mismatch",
            TlsKeyMismatch => "tls_key_mismatch",
            TlsKeyNotPinned { .. } => "tls_key_not_pinned",
            NonceMismatch => "nonce_mismatch",
            ReportDataMismatch => "report_data_mismatch",
            ReportVersionTooOld { .. } => "report_version_too_old",
            DebugNotAllowed => "debug_not_allowed",
            MigrationAgentNotAllowed => "migration_agent_not_allowed",
            VmplNotAllowed(_) => "vmpl_not_allowed",
            TcbTooLow { .. } => "tcb_too_low",
            MeasurementNotAllowed(_) => "measurement_not_allowed",
            ChipIdNotAllowed(_) => "chip_id_not_allowed",
            ModelIdentityNotAllowed(_) => "model_identity_not_allowed",
            SchemeIdentityNotAllowed(_) => "scheme_identity_not_allowed",
            RoleNotAllowed(_) => "role_not_allowed",
            ProtectionNotAllowed { .. } => "protection_not_allowed",
            SchemeSettingNotAllowed { .. } => "scheme_setting_not_allowed",
            PolicyInvalid(_) => "policy_invalid",
            ReleaseLog(e) => e.reason(),
        }
    }

    pub(crate) fn tcb_mismatch(vcek: impl std::fmt::Display, report: impl std::fmt::Display) -> Self {
        Self::VcekTcbMismatch { vcek: vcek.to_string(), report: report.to_string() }
    }
}

/// Every reason [`VerifyError::reason`] can return, e.g. to pre-register metric labels.
pub const REASONS: &[&str] = &[
    "evidence_malformed",
    "report_length",
    "report_malformed",
    "certificate_malformed",
    "root_not_trusted",
    "mock_root_not_trusted",
    "ark_self_signature_invalid",
    "ask_signature_invalid",
    "vcek_signature_invalid",
    "certificate_not_yet_valid",
    "certificate_expired",
    "vcek_key_invalid",
    "crl_missing",
    "crl_invalid",
    "crl_expired",
    "certificate_revoked",
    "signature_algorithm_unsupported",
    "report_signature_malformed",
    "report_signature_invalid",
    "vcek_tcb_mismatch",
    "vcek_chip_id_mismatch",
    "vcek_hwid_missing",
    "issuer_kind_mismatch",
    "scheme_json_mismatch",
    "role_mismatch",
    "model_identity_mismatch",
    "scheme_identity_mismatch",
    "tls_key_mismatch",
    "tls_key_not_pinned",
    "nonce_mismatch",
    "report_data_mismatch",
    "report_version_too_old",
    "debug_not_allowed",
    "migration_agent_not_allowed",
    "vmpl_not_allowed",
    "tcb_too_low",
    "measurement_not_allowed",
    "chip_id_not_allowed",
    "model_identity_not_allowed",
    "scheme_identity_not_allowed",
    "role_not_allowed",
    "protection_not_allowed",
    "scheme_setting_not_allowed",
    "policy_invalid",
    // The release log's (`crate::release::ReleaseLogError::reason`).
    "release_log_key_invalid",
    "release_bundle_malformed",
    "release_manifest_malformed",
    "release_checkpoint_malformed",
    "release_checkpoint_signature_invalid",
    "release_checkpoint_origin_mismatch",
    "release_proof_malformed",
    "release_inclusion_proof_invalid",
    "measurement_not_in_release_log",
    "release_log_rolled_back",
    "release_log_forked",
    "release_consistency_proof_missing",
];
