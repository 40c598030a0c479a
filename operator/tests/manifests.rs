//! The generated artifacts stay in step with the code: the CRD YAML in `crds/` and in the
//! chart equals what the Rust types generate, the `crdgen` and `manifests` subcommands work,
//! and the sample pipeline is one the operator accepts.

use std::path::PathBuf;
use std::process::Command;

use gelo_operator::crd::PrivateRAGPipeline;
use gelo_operator::validate::validate;

const CRD_FILE: &str = "privateragpipelines.gelo.dev.yaml";

fn repo() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into())).join("..")
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gelo-operator"))
}

#[test]
fn the_crd_files_equal_what_the_rust_types_generate() {
    let generated = gelo_operator::crd_yaml().expect("crd yaml");
    for dir in ["crds", "charts/gelo/crds"] {
        let path = repo().join(dir).join(CRD_FILE);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "{dir}/{CRD_FILE} differs from operator/src/crd.rs; regenerate it:\n  cargo run -p gelo-operator -- crdgen > {dir}/{CRD_FILE}"
        );
    }
}

#[test]
fn crdgen_prints_the_crd() {
    let out = bin().arg("crdgen").output().expect("run crdgen");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), gelo_operator::crd_yaml().expect("crd yaml"));
    let crd: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).expect("YAML");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], serde_yaml::Value::from("prp"));
    assert_eq!(crd["spec"]["versions"][0]["subresources"]["status"], serde_yaml::Value::Mapping(Default::default()));
}

#[test]
fn the_sample_pipeline_is_valid() {
    let text = std::fs::read_to_string(repo().join("e2e/kind/sample-pipeline.yaml")).expect("sample");
    let p: PrivateRAGPipeline = serde_yaml::from_str(&text).expect("sample decodes as a PrivateRAGPipeline");
    let valid = validate(&p.spec).expect("sample passes the reconciler's checks");
    assert!(valid.uses_mock_root().is_some());
}

#[test]
fn manifests_prints_every_object_the_reconciler_applies() {
    let out = bin().arg("manifests").arg(repo().join("e2e/kind/sample-pipeline.yaml")).output().expect("run manifests");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut kinds: Vec<String> = text
        .split("\n---\n")
        .chain(std::iter::once(""))
        .flat_map(|d| serde_yaml::Deserializer::from_str(d).map(serde_yaml::Value::deserialize).collect::<Vec<_>>())
        .filter_map(|v| v.ok()?.get("kind")?.as_str().map(String::from))
        .collect();
    kinds.sort();
    kinds.dedup();
    // Volume-sourced sample: no PVC or Job (see the hub case below).
    assert_eq!(kinds, ["ConfigMap", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]);

    // The hub-sourced fixture covers the PVC and the fetch Job.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("p.yaml");
    std::fs::write(&path, serde_yaml::to_string(&PrivateRAGPipeline::test()).expect("yaml")).expect("write");
    let out = bin().arg("manifests").arg(&path).output().expect("run manifests");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kind: Job") && text.contains("kind: PersistentVolumeClaim"));
}

#[test]
fn manifests_refuses_an_invalid_pipeline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.yaml");
    let p = PrivateRAGPipeline::test().with_spec(|s| s.embedder.model.model_identity = None);
    std::fs::write(&path, serde_yaml::to_string(&p).expect("yaml")).expect("write");
    let out = bin().arg("manifests").arg(&path).output().expect("run manifests");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("embedder.model.modelIdentity is missing"));
}

use serde::Deserialize;
