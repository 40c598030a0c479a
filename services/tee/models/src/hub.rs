//! Models from the Hugging Face hub, pinned by a 40-hex commit: only the weight,
//! configuration and tokenizer files are fetched, into a flat folder whose manifest gives
//! the model identity.

use std::path::{Path, PathBuf};

use hf_hub::{Repo, RepoType, api::sync::ApiBuilder};

use crate::{
    error::{ModelError, Result, io},
    identity::{Manifest, ModelIdentity, is_model_file},
};

/// Checks that `revision` pins a commit (40 hex digits), not a branch or tag.
pub fn check_revision(revision: &str) -> Result<()> {
    if revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ModelError::Hub(format!("revision `{revision}` is not a 40-hex commit id")))
    }
}

/// Downloads `repo` at `revision` into `out` and returns its manifest. With `expected`,
/// a manifest that hashes to anything else is refused and nothing is left in `out`.
///
/// The hub is `https://huggingface.co` unless `HF_ENDPOINT` names a mirror serving the same
/// URL layout (an air-gapped cluster's); a token from `HF_TOKEN` or `HF_HOME` reaches gated
/// repositories. The pins make a mirror as trustworthy as the hub: the commit it answers
/// for `revision` and the files' hashes are both checked.
pub fn fetch(repo: &str, revision: &str, out: &Path, expected: Option<&ModelIdentity>) -> Result<Manifest> {
    check_revision(revision)?;
    let cache = out.join(".hub-cache");
    let mut builder = ApiBuilder::from_env();
    if let Some(token) = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()) {
        builder = builder.with_token(Some(token));
    }
    let api = builder
        .with_cache_dir(cache.clone())
        .with_progress(false)
        .build()
        .map_err(|e| ModelError::Hub(e.to_string()))?;
    let repo_api = api.repo(Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string()));
    let info = repo_api.info().map_err(|e| ModelError::Hub(format!("{repo}@{revision}: {e}")))?;
    if !info.sha.eq_ignore_ascii_case(revision) {
        return Err(ModelError::Hub(format!("hub answered commit {} for revision {revision}", info.sha)));
    }
    let staging = out.join(".staging");
    std::fs::create_dir_all(&staging).map_err(io(&staging))?;
    let mut names = Vec::new();
    for s in info.siblings.iter().filter(|s| is_model_file(&s.rfilename)) {
        let src: PathBuf = repo_api.get(&s.rfilename).map_err(|e| ModelError::Hub(format!("{}: {e}", s.rfilename)))?;
        let dst = staging.join(&s.rfilename);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::copy(&src, &dst).map_err(io(&dst))?;
        names.push(s.rfilename.clone());
    }
    let manifest = Manifest::hash_files(&staging, &names)?;
    if let Some(e) = expected
        && let Err(err) = manifest.check(e)
    {
        let _ = std::fs::remove_dir_all(&staging);
        let _ = std::fs::remove_dir_all(&cache);
        return Err(err);
    }
    // Publish: move files from staging into `out`.
    for name in &names {
        let (from, to) = (staging.join(name), out.join(name));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::rename(&from, &to).map_err(io(&to))?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    let _ = std::fs::remove_dir_all(&cache);
    let manifest_path = out.join("gelo-manifest.json");
    std::fs::write(&manifest_path, serde_json::to_vec_pretty(&manifest).expect("manifest serializes"))
        .map_err(io(&manifest_path))?;
    Ok(manifest)
}
