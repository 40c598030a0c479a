//! The gateway's document store on disk: where it lives, the key that seals it, and opening
//! it once the embedding dimension is known.
//!
//! Layout of the data directory (mode 0700):
//! - `store.redb`: the `store::EncryptedRedbStore` (every record AES-256-GCM sealed);
//! - `store.json`: `{"dimension": N}`, so a restarted gateway opens the store before any
//!   embedder answers (the dimension is not secret: the file's record sizes reveal it anyway);
//! - `sealing.key`: the sealing key, in mock mode only (see [`KeySource`]).
//!
//! The store is created lazily by the first embedding, because only the embedder knows the
//! dimension and the gateway must start (and fail closed) without a verified embedder.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

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
    /// Derived by the AMD-SP from the launch measurement (`SNP_GET_DERIVED_KEY`), so only the
    /// same attested image can reopen the store. See [`snp_derived_sealing_key`].
    SnpDerived,
}

pub fn sealing_key(source: &KeySource) -> Result<SealingKey> {
    match source {
        KeySource::File(path) => Ok(SealingKey::from_file(path)?),
        KeySource::SnpDerived => snp_derived_sealing_key(),
    }
}

/// HOOK — SEV-SNP derived sealing key. On hardware the key must come from
/// `SNP_GET_DERIVED_KEY` (`/dev/sev-guest`), mixing in the launch measurement (and, ideally,
/// the guest SVN and TCB), so that a store copied off the host opens only inside the same
/// attested image. `gelo-attest` has no API for the derived-key request yet (only the report
/// request), so this refuses rather than fall back to a key file silently; give the gateway
/// `--sealing-key-file` explicitly until it exists.
pub fn snp_derived_sealing_key() -> Result<SealingKey> {
    Err(GatewayError::Config(
        "the SEV-SNP derived sealing key (SNP_GET_DERIVED_KEY) is not implemented yet: gelo-attest has no derived-key API; \
         pass --sealing-key-file to seal the store with a key file"
            .into(),
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
        let path = self.dir.join(DIMENSION_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(GatewayError::File { path, source: e }),
        };
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| GatewayError::Config(format!("{}: {e}", path.display())))?;
        let dim = v.get("dimension").and_then(|d| d.as_u64()).filter(|&d| d > 0);
        dim.map(|d| Some(d as usize)).ok_or_else(|| GatewayError::Config(format!("{}: no positive `dimension`", path.display())))
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
        if self.recorded_dimension()?.is_none() {
            write_durably(&self.dir.join(DIMENSION_FILE), format!("{{\"dimension\": {dim}}}\n").as_bytes())?;
        }
        let store = Arc::new(EncryptedRedbStore::open(self.dir.join(STORE_FILE), &self.key, dim).map_err(|e| match e {
            store::StoreError::DimensionMismatch { expected, got } => GatewayError::DimensionMismatch { expected, got },
            other => other.into(),
        })?);
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
        let again = DocStore::open(&data, key).unwrap();
        assert_eq!(again.get().expect("opened at start").dimension(), 4);
    }

    #[test]
    fn the_derived_key_hook_refuses_instead_of_falling_back() {
        let e = sealing_key(&KeySource::SnpDerived).unwrap_err().to_string();
        assert!(e.contains("SNP_GET_DERIVED_KEY") && e.contains("--sealing-key-file"), "{e}");
    }
}
