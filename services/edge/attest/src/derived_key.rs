//! Keys the AMD-SP derives for this guest (`SNP_GET_DERIVED_KEY`): a secret that only the
//! same launched image, on the same chip, can ask for again. It seals data at rest (the
//! gateway's document store) so that a copy taken off the host opens nowhere else.
//!
//! What the firmware mixes in ([`SnpDerivedKey`]):
//! - root key: the chip's VCEK, so the key is bound to this chip; at TCB version 0, which
//!   every platform may still derive, so a firmware (TCB) update does not lock data away;
//! - `GUEST_POLICY` and `MEASUREMENT`: another image, or the same image launched with
//!   another policy (e.g. debugging allowed), gets another key;
//! - the VMPL asked for (0 unless an SVSM runs below, `GELO_SNP_VMPL`), always mixed in.
//!
//! Not mixed in: `GUEST_SVN`, `FAMILY_ID` and `IMAGE_ID` (GELO launches without an ID block)
//! and the TCB (see above). Every caller goes through [`DerivedKeySource::derive_for`], so a
//! key made for one purpose is never another purpose's.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{AttestError, Result};

/// Where a guest's derived key comes from: the AMD-SP ([`SnpDerivedKey`]) or, in tests,
/// [`danger::SeededDerivedKey`].
pub trait DerivedKeySource: Send + Sync + std::fmt::Debug {
    /// The raw 32-byte key; the same source returns the same key every time.
    fn derive(&self) -> Result<[u8; 32]>;

    /// The key for one `purpose`: HMAC-SHA-256 keyed with [`Self::derive`] over the purpose
    /// label, so keys for different uses stay apart.
    fn derive_for(&self, purpose: &str) -> Result<[u8; 32]> {
        let root = self.derive()?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&root).map_err(|e| AttestError::crypto("derived key", e))?;
        mac.update(purpose.as_bytes());
        Ok(mac.finalize().into_bytes().into())
    }
}

/// The AMD-SP through `/dev/sev-guest`, asked for the key described in the module docs.
#[derive(Debug)]
pub struct SnpDerivedKey {
    #[cfg(target_os = "linux")]
    firmware: std::sync::Mutex<sev::firmware::guest::Firmware>,
    vmpl: u32,
}

impl SnpDerivedKey {
    /// Opens the guest device now, so a missing device or driver fails at start and says
    /// what failed.
    pub fn open() -> Result<Self> {
        #[cfg(target_os = "linux")]
        {
            let firmware = sev::firmware::guest::Firmware::open()
                .map_err(|e| AttestError::DerivedKey(format!("opening {}: {e}", crate::issuer::SEV_GUEST_DEVICE)))?;
            Ok(Self { firmware: std::sync::Mutex::new(firmware), vmpl: 0 })
        }
        #[cfg(not(target_os = "linux"))]
        Err(AttestError::SevDeviceAbsent(crate::issuer::SEV_GUEST_DEVICE.into()))
    }

    /// [`Self::open`], at the VMPL in `GELO_SNP_VMPL` (the one reports are requested at).
    pub fn from_env() -> Result<Self> {
        let key = Self::open()?;
        match std::env::var(crate::issuer::env::VMPL) {
            Ok(v) => {
                let vmpl = v
                    .parse()
                    .map_err(|_| AttestError::Config(format!("{}={v:?} is not a number", crate::issuer::env::VMPL)))?;
                Ok(key.with_vmpl(vmpl))
            }
            Err(_) => Ok(key),
        }
    }

    /// The VMPL mixed into the key; the firmware refuses one below the guest's own.
    pub fn with_vmpl(mut self, vmpl: u32) -> Self {
        self.vmpl = vmpl;
        self
    }
}

/// The request: VCEK root, guest policy and measurement mixed in, TCB version 0.
fn request(vmpl: u32) -> sev::firmware::guest::DerivedKey {
    use sev::firmware::guest::{DerivedKey, GuestFieldSelect};
    let mut fields = GuestFieldSelect::default();
    fields.set_guest_policy(true);
    fields.set_measurement(true);
    // root_key_select false: the VCEK (true would be the VM root key, which a migration
    // agent may hold). guest_svn and tcb_version 0: not selected, see the module docs.
    DerivedKey::new(false, fields, vmpl, 0, 0, None)
}

impl DerivedKeySource for SnpDerivedKey {
    #[cfg(target_os = "linux")]
    fn derive(&self) -> Result<[u8; 32]> {
        let mut firmware =
            self.firmware.lock().map_err(|_| AttestError::DerivedKey("guest device lock poisoned".into()))?;
        // Message version 1: every SEV-SNP firmware answers it (version 2 needs 1.58 and a
        // launch mitigation vector, which this key does not select).
        firmware.get_derived_key(Some(1), request(self.vmpl)).map_err(|e| AttestError::DerivedKey(e.to_string()))
    }

    #[cfg(not(target_os = "linux"))]
    fn derive(&self) -> Result<[u8; 32]> {
        Err(AttestError::SevDeviceAbsent(crate::issuer::SEV_GUEST_DEVICE.into()))
    }
}

/// Stand-ins that prove nothing. Never wired to a flag or a setting: only tests build them.
pub mod danger {
    use sha2::{Digest, Sha256};

    use super::DerivedKeySource;
    use crate::error::Result;

    /// A deterministic key from a seed, standing in for the AMD-SP's derived key: the same
    /// seed (think "the same measurement") gives the same key, another seed another key.
    #[derive(Clone)]
    pub struct SeededDerivedKey([u8; 32]);

    impl SeededDerivedKey {
        pub fn new(seed: impl AsRef<[u8]>) -> Self {
            Self(Sha256::new().chain_update(b"gelo/test-derived-key/v1\0").chain_update(seed).finalize().into())
        }
    }

    impl std::fmt::Debug for SeededDerivedKey {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("SeededDerivedKey(..)")
        }
    }

    impl DerivedKeySource for SeededDerivedKey {
        fn derive(&self) -> Result<[u8; 32]> {
            Ok(self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::danger::SeededDerivedKey;
    use super::*;

    #[test]
    fn purposes_and_seeds_give_distinct_keys() {
        let a = SeededDerivedKey::new(b"measurement A");
        assert_eq!(a.derive().unwrap(), SeededDerivedKey::new(b"measurement A").derive().unwrap());
        assert_ne!(a.derive().unwrap(), SeededDerivedKey::new(b"measurement B").derive().unwrap());
        let store = a.derive_for("store").unwrap();
        assert_eq!(store, a.derive_for("store").unwrap());
        assert_ne!(store, a.derive_for("other").unwrap());
        assert_ne!(store, a.derive().unwrap(), "a purpose key is not the raw firmware key");
    }

    #[test]
    fn the_request_selects_policy_and_measurement_from_the_vcek() {
        let r = request(1);
        assert_eq!(r.get_root_key_select(), 0, "VCEK");
        let f = r.guest_field_select;
        assert!(f.get_guest_policy() && f.get_measurement());
        assert!(!f.get_tcb_version() && !f.get_svn() && !f.get_image_id() && !f.get_family_id());
        assert_eq!((r.vmpl, r.guest_svn, r.tcb_version), (1, 0, 0));
    }

    #[test]
    fn a_missing_device_says_what_failed() {
        if std::path::Path::new(crate::issuer::SEV_GUEST_DEVICE).exists() {
            return; // an SEV-SNP guest: nothing to show here
        }
        let err = SnpDerivedKey::open().unwrap_err().to_string();
        assert!(err.contains(crate::issuer::SEV_GUEST_DEVICE), "{err}");
        #[cfg(target_os = "linux")]
        assert!(err.contains("SNP_GET_DERIVED_KEY") && err.contains("os error"), "{err}");
    }
}
