//! `model_identity`: what an attestation report commits to about the model bytes.
//!
//! The identity is SHA-256 over a canonical manifest: the sorted list of the model's
//! weight, configuration and tokenizer files with each file's SHA-256 and size. Files that
//! do not change what the model computes (READMEs, training metadata) are left out, so a
//! repository's documentation edits do not change the identity.

use std::{fmt, io::Read, path::Path, str::FromStr};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result, io};

/// SHA-256 of a model's canonical manifest.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelIdentity(pub [u8; 32]);

impl fmt::Display for ModelIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ModelIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModelIdentity({self})")
    }
}

impl FromStr for ModelIdentity {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        let bytes = hex::decode(s.trim()).map_err(|e| ModelError::Config(format!("model identity `{s}`: {e}")))?;
        let arr: [u8; 32] =
            bytes.try_into().map_err(|_| ModelError::Config(format!("model identity `{s}` is not 64 hex digits")))?;
        Ok(ModelIdentity(arr))
    }
}

/// One file of the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Path relative to the model root, with `/` separators.
    pub name: String,
    pub sha256: String,
    pub bytes: u64,
}

/// The files a model is made of, sorted by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub files: Vec<ManifestEntry>,
}

/// Whether a file belongs in the manifest (weights, configuration, tokenizer).
pub fn is_model_file(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    let ext = base.rsplit('.').next().unwrap_or("");
    matches!(ext, "safetensors" | "gguf")
        || matches!(
            base,
            "config.json"
                | "generation_config.json"
                | "tokenizer.json"
                | "tokenizer_config.json"
                | "special_tokens_map.json"
                | "vocab.txt"
                | "vocab.json"
                | "merges.txt"
                | "added_tokens.json"
                | "modules.json"
                | "sentence_bert_config.json"
                | "config_sentence_transformers.json"
                | "model.safetensors.index.json"
        )
}

impl Manifest {
    /// Hashes `files` (relative to `root`).
    pub fn hash_files(root: &Path, files: &[String]) -> Result<Self> {
        let mut entries = files
            .iter()
            .map(|name| {
                let path = root.join(name);
                let mut f = std::fs::File::open(&path).map_err(io(&path))?;
                let mut hasher = Sha256::new();
                let mut buf = vec![0u8; 1 << 20];
                let mut bytes = 0u64;
                loop {
                    let n = f.read(&mut buf).map_err(io(&path))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    bytes += n as u64;
                }
                Ok(ManifestEntry { name: name.replace('\\', "/"), sha256: hex::encode(hasher.finalize()), bytes })
            })
            .collect::<Result<Vec<_>>>()?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Manifest { files: entries })
    }

    /// The model files under `root`: a directory walked for [`is_model_file`] names, or a
    /// single `.gguf` file.
    pub fn of_path(path: &Path) -> Result<(std::path::PathBuf, Self)> {
        if path.is_file() {
            let root = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            return Ok((root.clone(), Self::hash_files(&root, &[name])?));
        }
        let mut names = Vec::new();
        walk(path, path, &mut names)?;
        if names.is_empty() {
            return Err(ModelError::Config(format!("{} holds no model files", path.display())));
        }
        Ok((path.to_path_buf(), Self::hash_files(path, &names)?))
    }

    /// Canonical bytes: one line per file, `sha256  bytes  name`, after a version line.
    pub fn canonical(&self) -> String {
        let mut s = String::from("gelo-model-manifest/v1\n");
        for e in &self.files {
            s.push_str(&format!("{}  {}  {}\n", e.sha256, e.bytes, e.name));
        }
        s
    }

    pub fn identity(&self) -> ModelIdentity {
        ModelIdentity(Sha256::digest(self.canonical().as_bytes()).into())
    }

    /// Refuses a manifest whose identity is not `expected`.
    pub fn check(&self, expected: &ModelIdentity) -> Result<()> {
        let actual = self.identity();
        if &actual != expected {
            return Err(ModelError::IdentityMismatch { expected: expected.to_string(), actual: actual.to_string() });
        }
        Ok(())
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
        if rel.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, out)?;
        } else if is_model_file(&rel) {
            out.push(rel);
        }
    }
    Ok(())
}
