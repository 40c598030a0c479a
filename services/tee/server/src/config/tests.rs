//! Layering of a service's configuration: flag over environment over file over default.
//! The environment is an explicit map: nothing here touches the process's.

use std::{net::SocketAddr, path::Path};

use protocol::{MaskKind, Protection};
use serde_json::json;

use super::*;

fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
}

const FILE: &str = "model: /models/from-file\nmax-queue: 11\nmax-texts: 12\nmax-documents: 13\n\
                    protection: masked\nplaintext: true\n";

#[test]
fn flag_over_env_over_file_over_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path(), "service.yaml", FILE);
    let sources = Sources {
        file: Some(path.as_path()),
        // max-queue: flag, env and file; max-texts: env and file; max-documents: file only.
        env: env(&[("GELO_MAX_QUEUE", "21"), ("GELO_MAX_TEXTS", "22"), ("GELO_MASK", "HD3")]),
        flags: json!({ "max-queue": 31, "listen": "127.0.0.1:7000" }),
    };
    let cfg = ServiceConfig::load(&sources).unwrap();
    assert_eq!(cfg.max_queue, 31, "flag over env and file");
    assert_eq!(cfg.max_texts, 22, "env over file");
    assert_eq!(cfg.max_documents, 13, "file over default");
    assert_eq!(cfg.max_output_tokens, Limits::default().max_output_tokens, "default");
    assert_eq!(cfg.model, PathBuf::from("/models/from-file"));
    assert_eq!(cfg.protection, Protection::Masked);
    assert_eq!(cfg.mask, MaskKind::Hd3, "parsed as the flag parses it (case-insensitive)");
    assert!(cfg.plaintext);
    assert_eq!(cfg.listen, "127.0.0.1:7000".parse::<SocketAddr>().unwrap());
    assert_eq!(cfg.engine, "cpu");
}

#[test]
fn defaults_are_the_flags_defaults() {
    let sources = Sources { file: None, env: vec![], flags: json!({ "model": "m" }) };
    let cfg = ServiceConfig::load(&sources).unwrap();
    assert_eq!(cfg, ServiceConfig { model: "m".into(), ..ServiceConfig::default() });
    assert_eq!(cfg.listen, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    assert_eq!((cfg.shield_rows, cfg.verify_probes, cfg.batch_window_ms), (8, 2, 5));
}

#[test]
fn unknown_file_key_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path(), "service.yaml", "model: m\nmax_queue: 5\n");
    let sources = Sources { file: Some(path.as_path()), env: vec![], flags: json!({}) };
    let err = ServiceConfig::load(&sources).unwrap_err().to_string();
    assert!(err.contains("unknown key `max_queue`"), "{err}");
    assert!(err.contains("did you mean `max-queue`"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
}

#[test]
fn unrelated_gelo_variables_and_empty_ones_are_ignored() {
    let sources = Sources {
        file: None,
        env: env(&[
            ("GELO_ATTEST_ISSUER", "mock"),
            ("GELO_CACHE", "/tmp"),
            ("GELO_MODEL", "m"),
            ("GELO_MAX_QUEUE", ""),
        ]),
        flags: json!({}),
    };
    let cfg = ServiceConfig::load(&sources).unwrap();
    assert_eq!(cfg.model, PathBuf::from("m"));
    assert_eq!(cfg.max_queue, Limits::default().max_queue);
}

#[test]
fn json_file_and_errors_name_key_and_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path(), "service.json", r#"{"model": "m", "insecure": true, "max-queue": "7"}"#);
    let ok = Sources { file: Some(path.as_path()), env: vec![], flags: json!({}) };
    let cfg = ServiceConfig::load(&ok).unwrap();
    assert!(cfg.insecure);
    assert_eq!(cfg.max_queue, 7);

    let bad_env = Sources { file: None, env: env(&[("GELO_MAX_QUEUE", "many")]), flags: json!({ "model": "m" }) };
    let err = ServiceConfig::load(&bad_env).unwrap_err().to_string();
    assert!(err.contains("GELO_MAX_QUEUE") && err.contains("environment"), "{err}");

    let bad_file = Sources { file: Some(path.as_path()), env: env(&[("GELO_LISTEN", "nowhere")]), flags: json!({}) };
    let err = ServiceConfig::load(&bad_file).unwrap_err().to_string();
    assert!(err.contains("GELO_LISTEN"), "{err}");

    let missing = Sources { file: Some(Path::new("/nonexistent/gelo.yaml")), env: vec![], flags: json!({}) };
    let err = ServiceConfig::load(&missing).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/gelo.yaml"), "{err}");
}

#[test]
fn a_model_is_required() {
    let sources = Sources { file: None, env: vec![], flags: json!({}) };
    let err = ServiceConfig::load(&sources).unwrap_err().to_string();
    assert!(err.contains("--model"), "{err}");
}

#[test]
fn field_names_are_the_keys() {
    let keys = layers::field_names::<ServiceConfig>();
    assert!(keys.contains(&"max-queue") && keys.contains(&"otlp-endpoint"), "{keys:?}");
    assert_eq!(keys.len(), 29);
}
