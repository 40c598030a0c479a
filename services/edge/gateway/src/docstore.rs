//! The gateway's document store on disk: where it lives, the key that seals it, and opening
//! it once the embedding dimension is known.
//!
//! Layout of the data directory (mode 0700):
//! - `store.redb`: the `store::EncryptedRedbStore` (every record AES-256-GCM sealed);
//! - `store.json`: `{"dimension": N, "created": true}`, so a restarted gateway opens the store
//!   before any embedder answers (the dimension is not secret: the file's record sizes reveal
//!   it anyway), and knows the store file must exist: a store file gone missing is refused,
//!   never replaced by a new, empty store (`created` is written once the file exists);
//! - `sealing.key`: the sealing key, in mock mode only (see [`KeySource`]); on SEV-SNP
//!   hardware the key is derived by the AMD-SP and never written anywhere.
//!
//! The store is created lazily by the first embedding, because only the embedder knows the
//! dimension and the gateway must start (and fail closed) without a verified embedder.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use attest::{IssuerKind, derived_key::DerivedKeySource};
use store::{EncryptedRedbStore, SealingKey, VectorStore};

use crate::error::{GatewayError, Result};

pub const STORE_FILE: &str = "store.redb";
pub const DIMENSION_FILE: &str = "store.json";
pub const KEY_FILE: &str = "sealing.key";

/// Where the sealing key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// A key file, created with a fresh random key on first use. Mock mode: whoever can read
    /// the file can read the store.
    File(PathBuf),
    /// Derived by the AMD-SP from this chip, the launch measurement and the guest policy
    /// (`SNP_GET_DERIVED_KEY`), so only the same attested image on the same host can reopen
    /// the store. See [`snp_derived_sealing_key`].
    SnpDerived,
}

/// The gateway's choice: an explicit key file wins; otherwise `DATA_DIR/sealing.key` with
/// mock attestation and the SEV-SNP derived key on hardware (never a file there).
pub fn key_source(sealing_key_file: Option<&Path>, data_dir: &Path, issuer: IssuerKind) -> KeySource {
    match (sealing_key_file, issuer) {
        (Some(f), _) => KeySource::File(f.to_path_buf()),
        (None, IssuerKind::Mock) => KeySource::File(data_dir.join(KEY_FILE)),
        (None, IssuerKind::SevSnp) => KeySource::SnpDerived,
    }
}

pub fn sealing_key(source: &KeySource) -> Result<SealingKey> {
    match source {
        KeySource::File(path) => Ok(SealingKey::from_file(path)?),
        KeySource::SnpDerived => snp_derived_sealing_key(),
    }
}

/// The purpose label the store's key is derived under (see
/// [`DerivedKeySource::derive_for`]): a new label, a new key.
pub const SEALING_KEY_PURPOSE: &str = "gelo/gateway/docstore-sealing-key/v1";

/// The sealing key from the AMD-SP (`/dev/sev-guest`, `attest::derived_key::SnpDerivedKey`).
/// Refuses, saying what failed, when the device cannot be opened or the firmware refuses:
/// never a silent fallback to a key file.
pub fn snp_derived_sealing_key() -> Result<SealingKey> {
    let firmware = attest::derived_key::SnpDerivedKey::from_env().map_err(derived_key_unavailable)?;
    derived_sealing_key(&firmware)
}

/// The sealing key from any derived-key source: the AMD-SP on hardware, a seeded stand-in
/// in tests.
pub fn derived_sealing_key(source: &dyn DerivedKeySource) -> Result<SealingKey> {
    let key = source.derive_for(SEALING_KEY_PURPOSE).map_err(derived_key_unavailable)?;
    Ok(SealingKey::from_bytes(key))
}

fn derived_key_unavailable(e: attest::AttestError) -> GatewayError {
    GatewayError::Config(format!(
        "the SEV-SNP derived sealing key is unavailable ({e}); pass --sealing-key-file to seal the store with a key file"
    ))
}

/// The store, opened once its dimension is known.
pub struct DocStore {
    dir: PathBuf,
    key: SealingKey,
    opened: Mutex<Option<Arc<EncryptedRedbStore>>>,
}

impl DocStore {
    /// Prepares `dir`; opens the store now if an earlier run created it. Blocking.
    pub fn open(dir: &Path, key: SealingKey) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(GatewayError::file(dir))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(GatewayError::file(dir))?;
        }
        let s = DocStore { dir: dir.to_path_buf(), key, opened: Mutex::new(None) };
        if let Some(dim) = s.recorded_dimension()? {
            s.get_or_create(dim)?;
        } else if dir.join(STORE_FILE).exists() {
            return Err(GatewayError::Config(format!(
                "{} exists without {DIMENSION_FILE}: write {{\"dimension\": N}} there with the store's embedding dimension",
                dir.join(STORE_FILE).display()
            )));
        }
        Ok(s)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn recorded_dimension(&self) -> Result<Option<usize>> {
        Ok(self.recorded()?.map(|(dim, _)| dim))
    }

    /// `store.json`: the dimension, and whether the store file was created.
    fn recorded(&self) -> Result<Option<(usize, bool)>> {
        let path = self.dir.join(DIMENSION_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(GatewayError::File { path, source: e }),
        };
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| GatewayError::Config(format!("{}: {e}", path.display())))?;
        let dim = v.get("dimension").and_then(|d| d.as_u64()).filter(|&d| d > 0);
        let created = v.get("created").and_then(|c| c.as_bool()).unwrap_or(false);
        dim.map(|d| Some((d as usize, created)))
            .ok_or_else(|| GatewayError::Config(format!("{}: no positive `dimension`", path.display())))
    }

    /// The store if it exists yet.
    pub fn get(&self) -> Option<Arc<EncryptedRedbStore>> {
        self.opened.lock().expect("store").clone()
    }

    /// The store for vectors of `dim`, created on first use. Blocking.
    pub fn get_or_create(&self, dim: usize) -> Result<Arc<EncryptedRedbStore>> {
        let mut opened = self.opened.lock().expect("store");
        if let Some(s) = &*opened {
            if s.dimension() != dim {
                return Err(GatewayError::DimensionMismatch { expected: s.dimension(), got: dim });
            }
            return Ok(s.clone());
        }
        let recorded = self.recorded()?;
        if recorded.is_none() {
            write_durably(&self.dir.join(DIMENSION_FILE), format!("{{\"dimension\": {dim}}}\n").as_bytes())?;
        }
        let created = recorded.is_some_and(|(_, created)| created);
        let file = self.dir.join(STORE_FILE);
        if created && !file.exists() {
            return Err(GatewayError::Store(store::StoreError::Corrupt {
                kind: store::RecordKind::File,
                reason: format!("{} is missing, though {DIMENSION_FILE} records that it was created", file.display()),
            }));
        }
        let store =
            Arc::new(EncryptedRedbStore::open(self.dir.join(STORE_FILE), &self.key, dim).map_err(|e| match e {
                store::StoreError::DimensionMismatch { expected, got } => {
                    GatewayError::DimensionMismatch { expected, got }
                }
                other => other.into(),
            })?);
        if !created {
            let record = format!("{{\"dimension\": {}, \"created\": true}}\n", store.dimension());
            write_durably(&self.dir.join(DIMENSION_FILE), record.as_bytes())?;
        }
        *opened = Some(store.clone());
        Ok(store)
    }
}

/// Write-then-rename with fsyncs, so a crash leaves the old file or the new one.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(GatewayError::file(&tmp))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(GatewayError::file(&tmp))?;
    std::fs::rename(&tmp, path).map_err(GatewayError::file(path))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(GatewayError::file(dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_created_on_first_use_and_reopened_with_its_dimension() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let key = sealing_key(&KeySource::File(dir.path().join(KEY_FILE))).unwrap();
        let s = DocStore::open(&data, key.clone()).unwrap();
        assert!(s.get().is_none(), "nothing is created before the first embedding");
        s.get_or_create(4).unwrap();
        assert!(matches!(s.get_or_create(8), Err(GatewayError::DimensionMismatch { expected: 4, got: 8 })));
        drop(s);
        let again = DocStore::open(&data, key.clone()).unwrap();
        assert_eq!(again.get().expect("opened at start").dimension(), 4);
        drop(again);
        // The store file lost (deleted, or cut to nothing): refused, never a new, empty store.
        std::fs::write(data.join(STORE_FILE), b"").unwrap();
        let err = DocStore::open(&data, key.clone()).err().expect("an emptied store file is refused");
        assert!(matches!(err, GatewayError::Store(store::StoreError::Corrupt { .. })), "{err}");
        std::fs::remove_file(data.join(STORE_FILE)).unwrap();
        let err = DocStore::open(&data, key).err().expect("a missing store file is refused");
        assert!(matches!(err, GatewayError::Store(store::StoreError::Corrupt { .. })), "{err}");
        assert!(err.to_string().contains("is missing"), "{err}");
    }

    #[test]
    fn hardware_without_a_key_file_seals_with_the_derived_key() {
        let data = Path::new("/data");
        assert_eq!(key_source(None, data, IssuerKind::SevSnp), KeySource::SnpDerived);
        assert_eq!(key_source(None, data, IssuerKind::Mock), KeySource::File(data.join(KEY_FILE)));
        let file = Path::new("/keys/k");
        assert_eq!(key_source(Some(file), data, IssuerKind::SevSnp), KeySource::File(file.into()));
    }

    #[test]
    fn the_store_opens_with_the_derived_key_and_not_with_another_images() {
        use attest::derived_key::danger::SeededDerivedKey;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let image_a = SeededDerivedKey::new(b"measurement A");
        let s = DocStore::open(&data, derived_sealing_key(&image_a).unwrap()).unwrap();
        s.get_or_create(4).unwrap();
        drop(s);
        // The same launch derives the same key: the store reopens.
        let again =
            DocStore::open(&data, derived_sealing_key(&SeededDerivedKey::new(b"measurement A")).unwrap()).unwrap();
        assert_eq!(again.get().expect("opened at start").dimension(), 4);
        drop(again);
        // Another image (another measurement) derives another key: the store stays shut.
        let image_b = SeededDerivedKey::new(b"measurement B");
        let err =
            DocStore::open(&data, derived_sealing_key(&image_b).unwrap()).err().expect("another key must not open it");
        assert!(matches!(err, GatewayError::Store(store::StoreError::WrongKey)), "{err}");
        // Nothing about the key was written next to the store.
        assert!(!data.join(KEY_FILE).exists());
    }

    #[test]
    fn without_the_guest_device_the_derived_key_refuses_and_says_why() {
        if Path::new(attest::issuer::SEV_GUEST_DEVICE).exists() {
            return; // an SEV-SNP guest: the key is derived instead
        }
        let e = sealing_key(&KeySource::SnpDerived).unwrap_err().to_string();
        assert!(e.contains("SNP_GET_DERIVED_KEY") && e.contains("--sealing-key-file"), "{e}");
        assert!(e.contains(attest::issuer::SEV_GUEST_DEVICE), "names the device that did not open: {e}");
    }
}
