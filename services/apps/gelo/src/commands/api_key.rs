//! `gelo api-key new|list|revoke`: the keys of a gateway's HTTP port, kept as SHA-256
//! digests in its `--api-keys-file` (format and checks: `gateway::http::keys`). A running
//! gateway reads the file again within a second of a change: a new key works and a revoked
//! one stops working without a restart.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gateway::http::keys::{self, ApiKey};

#[derive(clap::Subcommand, Clone, Debug)]
pub enum ApiKeyCommand {
    /// Make a key, add its digest to the keys file (created owner-only if missing) and print
    /// the key once: only its digest is kept.
    New {
        #[arg(long, value_name = "FILE")]
        keys_file: PathBuf,
        /// A name for the key in the file and in the gateway's logs (A-Z a-z 0-9 . _ - @ +).
        #[arg(long)]
        name: Option<String>,
    },
    /// The keys in the file: id (the first 8 hex digits of the digest) and name.
    List {
        #[arg(long, value_name = "FILE")]
        keys_file: PathBuf,
    },
    /// Remove the keys with this id or name from the file (rewritten whole, then renamed).
    Revoke {
        #[arg(long, value_name = "FILE")]
        keys_file: PathBuf,
        /// The key's id (from `list`) or name.
        id: String,
    },
}

/// Makes a key and adds its digest to `file`; the key is the caller's to show, once.
pub fn new_key(file: &Path, name: Option<&str>) -> Result<ApiKey> {
    let key = ApiKey::generate();
    keys::append(file, &key.digest(), name).with_context(|| format!("adding a key to {}", file.display()))?;
    Ok(key)
}

pub fn run(cmd: ApiKeyCommand) -> Result<()> {
    match cmd {
        ApiKeyCommand::New { keys_file, name } => {
            let key = new_key(&keys_file, name.as_deref())?;
            eprintln!(
                "Added key {} to {}. The key is shown once, here; only its SHA-256 is kept:",
                key.digest().id(),
                keys_file.display()
            );
            println!("{}", key.expose());
        }
        ApiKeyCommand::List { keys_file } => {
            let entries = keys::read(&keys_file)?;
            for e in &entries {
                println!("{}  {}", e.digest.id(), e.name.as_deref().unwrap_or("-"));
            }
            eprintln!("{} key(s) in {}", entries.len(), keys_file.display());
        }
        ApiKeyCommand::Revoke { keys_file, id } => {
            let removed = keys::remove(&keys_file, &id)?;
            for e in &removed {
                eprintln!("revoked {} ({})", e.digest.id(), e.name.as_deref().unwrap_or("no name"));
            }
            eprintln!("a running gateway refuses it within a second");
        }
    }
    Ok(())
}
