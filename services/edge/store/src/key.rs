//! The sealing key: the one secret that protects a store at rest.
//!
//! On SEV-SNP hardware the gateway derives it from the AMD-SP (bound to the measured launch),
//! so only the same attested image can reopen the store; it hands the 32 bytes to
//! [`SealingKey::from_bytes`]. In mock mode there is no hardware to derive from, and the key
//! lives in a file next to the store ([`SealingKey::from_file`]): that protects nothing against
//! a host that can read the file, which is exactly what mock mode admits.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use rand::TryRng;
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::error::{Result, StoreError};

/// A 256-bit key that seals every record of a store. Zeroed when dropped; never printed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SealingKey([u8; SealingKey::LEN]);

impl SealingKey {
    pub const LEN: usize = 32;

    pub fn from_bytes(bytes: [u8; Self::LEN]) -> Self {
        SealingKey(bytes)
    }

    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<Self> {
        let mut bytes = [0u8; Self::LEN];
        rand::rngs::SysRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| StoreError::Io(std::io::Error::other(format!("OS random source: {e}"))))?;
        Ok(SealingKey(bytes))
    }

    /// Loads the key file at `path`, creating it with a fresh random key (mode 0600) if it
    /// does not exist. The file holds the key as 64 hex digits; 32 raw bytes are accepted
    /// too, so a key made with `head -c 32 /dev/urandom` works.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        match fs::read(path) {
            Ok(bytes) => return Self::parse_file(path, bytes),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(key_file(path, format!("cannot read: {e}"))),
        }
        let key = Self::generate()?;
        match write_new_key_file(path, &key) {
            Ok(()) => Ok(key),
            // Another process created it between our read and our link: theirs wins, so that
            // both processes seal with the same key.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let bytes = fs::read(path).map_err(|e| key_file(path, format!("cannot read: {e}")))?;
                Self::parse_file(path, bytes)
            }
            Err(e) => Err(key_file(path, format!("cannot create: {e}"))),
        }
    }

    pub(crate) fn expose(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    fn parse_file(path: &Path, mut bytes: Vec<u8>) -> Result<Self> {
        warn_if_readable_by_others(path);
        let parsed = if bytes.len() == Self::LEN {
            let mut key = [0u8; Self::LEN];
            key.copy_from_slice(&bytes);
            Ok(SealingKey(key))
        } else {
            let text = bytes.trim_ascii();
            let mut key = [0u8; Self::LEN];
            match hex::decode_to_slice(text, &mut key) {
                Ok(()) => Ok(SealingKey(key)),
                Err(_) => {
                    key.zeroize();
                    Err(key_file(path, format!("expected 64 hex digits or 32 raw bytes, found {} bytes", bytes.len())))
                }
            }
        };
        bytes.zeroize();
        parsed
    }
}

impl fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealingKey(..)")
    }
}

fn key_file(path: &Path, reason: String) -> StoreError {
    StoreError::KeyFile { path: path.to_path_buf(), reason }
}

/// Writes the key to a private temporary file, then hard-links it into place: the link fails
/// if the name exists, so a concurrent creator is never overwritten, and the key file is never
/// seen half-written.
fn write_new_key_file(path: &Path, key: &SealingKey) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| std::io::Error::other("key path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);

    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = (|| {
        let mut file = options.open(&tmp)?;
        let mut text = hex::encode(key.expose()).into_bytes();
        text.push(b'\n');
        let result = file.write_all(&text).and_then(|()| file.sync_all());
        text.zeroize();
        result?;
        fs::hard_link(&tmp, path)
    })();
    let _ = fs::remove_file(&tmp);
    written?;
    // Make the new directory entry durable too: a key lost in a crash would orphan every
    // record sealed under it.
    #[cfg(unix)]
    fs::File::open(&dir)?.sync_all()?;
    Ok(())
}

fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "sealing key file is readable by group or others");
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}
