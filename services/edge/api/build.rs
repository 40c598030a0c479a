//! Compiles `proto/gelo/v1/*.proto` with a vendored `protoc`, so no system package is needed.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded.
        unsafe { env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../../../proto");
    let protos: Vec<PathBuf> =
        ["inference", "attestation", "rag"].iter().map(|p| root.join(format!("gelo/v1/{p}.proto"))).collect();
    let include = protoc_bin_vendored::include_path()?;
    let descriptor = PathBuf::from(env::var("OUT_DIR")?).join("gelo_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor)
        .compile_protos(&protos, &[root.clone(), include])?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
