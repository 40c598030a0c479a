//! Identity, missing tensors, unknown architectures: clear errors.

use std::io::Write;

use models::{LoadOptions, Manifest, ModelError, ModelIdentity, load_embedder, load_generator};

use crate::support::*;

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

#[test]
fn identity_covers_model_files_only_and_mismatch_is_refused() {
    let src = model("all-minilm-l6-v2");
    let dir = std::env::temp_dir().join(format!("gelo-identity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&src, &dir);
    let (_, m1) = Manifest::of_path(&dir).unwrap();
    let names: Vec<&str> = m1.files.iter().map(|f| f.name.as_str()).collect();
    assert!(
        names.contains(&"model.safetensors")
            && names.contains(&"tokenizer.json")
            && names.contains(&"1_Pooling/config.json")
    );
    assert!(!names.contains(&"README.md"));
    // Documentation does not change the identity; a config byte does.
    std::fs::write(dir.join("README.md"), "changed").unwrap();
    assert_eq!(Manifest::of_path(&dir).unwrap().1.identity(), m1.identity());
    let mut f = std::fs::OpenOptions::new().append(true).open(dir.join("config.json")).unwrap();
    writeln!(f).unwrap();
    let id2 = Manifest::of_path(&dir).unwrap().1.identity();
    assert_ne!(id2, m1.identity());
    let opts = LoadOptions { expected_identity: Some(m1.identity()), ..Default::default() };
    match load_embedder(&dir, plain(), &opts) {
        Err(ModelError::IdentityMismatch { expected, actual }) => {
            assert_eq!(expected, m1.identity().to_string());
            assert_eq!(actual, id2.to_string());
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a mismatching model loaded"),
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!("zz".parse::<ModelIdentity>().is_err());
}

#[test]
fn missing_tensors_and_unknown_architectures_are_named() {
    let src = model("all-minilm-l6-v2");
    let dir = std::env::temp_dir().join(format!("gelo-broken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&src, &dir);
    // A config claiming more layers than the weights have.
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("\"num_hidden_layers\": 6", "\"num_hidden_layers\": 7");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let err = load_embedder(&dir, plain(), &LoadOptions::default()).err().expect("must fail");
    assert!(matches!(&err, ModelError::MissingTensor(n) if n.contains("encoder.layer.6")), "{err}");
    // An architecture we do not implement.
    let cfg = std::fs::read_to_string(src.join("config.json"))
        .unwrap()
        .replace("\"model_type\": \"bert\"", "\"model_type\": \"mamba\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let err = load_generator(&dir, plain(), &LoadOptions::default()).err().expect("must fail");
    assert!(
        matches!(&err, ModelError::UnknownArchitecture(a) if a == "mamba") || err.to_string().contains("mamba"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_folder_holding_one_gguf_loads_as_that_file() {
    let file = model("smollm2-135m-instruct.gguf");
    let dir = std::env::temp_dir().join(format!("gelo-gguf-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&file, dir.join("smollm2-135m-instruct.gguf")).unwrap();
    let from_dir = models::ModelFiles::inspect(&dir, None).unwrap();
    let from_file = models::ModelFiles::inspect(&file, None).unwrap();
    assert_eq!(from_dir.identity, from_file.identity);
    assert!(matches!(from_dir.kind, models::Kind::Decoder(_)));
    let _ = std::fs::remove_dir_all(&dir);
}
