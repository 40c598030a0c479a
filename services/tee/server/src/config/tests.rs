//! Layering of a service's configuration: flag over environment over file over default.
//! The environment is an explicit map: nothing here touches the process's.

use std::{net::SocketAddr, path::Path};

use protocol::{DecodeMasks, MaskKind, Protection};
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
    assert_eq!(cfg.protocol.protection, Protection::Masked);
    assert_eq!(cfg.protocol.mask, MaskKind::Hd3, "parsed as the flag parses it (case-insensitive)");
    assert!(cfg.plaintext);
    assert_eq!(cfg.listen, "127.0.0.1:7000".parse::<SocketAddr>().unwrap());
    assert_eq!(cfg.protocol.engine, "cpu");
}

#[test]
fn defaults_are_the_flags_defaults() {
    let sources = Sources { file: None, env: vec![], flags: json!({ "model": "m" }) };
    let cfg = ServiceConfig::load(&sources).unwrap();
    assert_eq!(cfg, ServiceConfig { model: "m".into(), ..ServiceConfig::default() });
    assert_eq!(cfg.listen, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    assert_eq!((cfg.protocol.shield_rows, cfg.protocol.verify_probes, cfg.batch_window_ms), (8, 2, 5));
    assert_eq!(cfg.protocol.shield_energy, 4.0);
    assert_eq!(cfg.protocol.engine_recycle_mib, 1024);
    assert_eq!((cfg.protocol.protection, cfg.protocol.decode_masks), (Protection::Sealed, DecodeMasks::PerSequence));
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
fn keys_are_the_flag_names_with_the_protocol_section_in_place() {
    let keys = ServiceConfig::keys();
    assert!(keys.contains(&"max-queue") && keys.contains(&"otlp-endpoint"), "{keys:?}");
    assert!(!keys.contains(&"protocol"), "a section is not a key: {keys:?}");
    assert_eq!(keys.len(), 29);
    let protocol = ["protection", "engine", "mask", "shield-rows", "shield-energy", "decode-masks"];
    assert_eq!(keys[2..8], protocol, "in the field's place: {keys:?}");
    assert_eq!(ProtocolConfig::keys()[..6], protocol);
    assert_eq!(ProtocolConfig::keys().len(), 8);
    assert_eq!(layers::field_names::<ServiceConfig>().len(), 29 - 8 + 1);
}

/// One protocol key (`shield-rows`) on every layer, then with the top ones taken away.
#[test]
fn protocol_key_flag_over_env_over_file_over_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path(), "service.yaml", "model: m\nshield-rows: 3\nmask: haar\n");
    let all = Sources {
        file: Some(path.as_path()),
        env: env(&[("GELO_SHIELD_ROWS", "5"), ("GELO_DECODE_MASKS", "shared")]),
        flags: json!({ "shield-rows": 7, "engine": "vulkan:1" }),
    };
    let cfg = ServiceConfig::load(&all).unwrap();
    assert_eq!(cfg.protocol.shield_rows, 7, "flag over env and file");
    // Keys of one section from three layers merge.
    assert_eq!(cfg.protocol.mask, MaskKind::Haar, "file");
    assert_eq!(cfg.protocol.decode_masks, DecodeMasks::Shared, "env");
    assert_eq!(cfg.protocol.engine, "vulkan:1", "flag");
    assert_eq!(cfg.protocol.verify_probes, 2, "default");

    let no_flag = Sources { flags: json!({ "engine": "vulkan:1" }), ..all.clone() };
    assert_eq!(ServiceConfig::load(&no_flag).unwrap().protocol.shield_rows, 5, "env over file");
    let file_only = Sources { env: vec![], ..no_flag.clone() };
    assert_eq!(ServiceConfig::load(&file_only).unwrap().protocol.shield_rows, 3, "file over default");
    let nothing = Sources { file: None, ..file_only };
    assert_eq!(
        ServiceConfig::load(&Sources { flags: json!({ "model": "m" }), ..nothing }).unwrap().protocol.shield_rows,
        8
    );
}

#[test]
fn protocol_errors_name_the_key_as_its_layer_writes_it() {
    let bad_env = Sources { file: None, env: env(&[("GELO_SHIELD_ROWS", "many")]), flags: json!({ "model": "m" }) };
    let err = ServiceConfig::load(&bad_env).unwrap_err().to_string();
    assert!(err.contains("\"GELO_SHIELD_ROWS\"") && err.contains("environment"), "{err}");
    let bad_flag = Sources { file: None, env: vec![], flags: json!({ "model": "m", "mask": "round" }) };
    let err = ServiceConfig::load(&bad_flag).unwrap_err().to_string();
    assert!(err.contains("\"--mask\"") && err.contains("command line"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path(), "service.yaml", "model: m\nshield_rows: 5\n");
    let misspelt = Sources { file: Some(path.as_path()), env: vec![], flags: json!({}) };
    let err = ServiceConfig::load(&misspelt).unwrap_err().to_string();
    assert!(err.contains("did you mean `shield-rows`"), "{err}");
    // The section is no key of the file: its keys are.
    let nested = file(dir.path(), "nested.yaml", "model: m\nprotocol:\n  shield-rows: 5\n");
    let err = ServiceConfig::load(&Sources { file: Some(nested.as_path()), ..misspelt }).unwrap_err().to_string();
    assert!(err.contains("unknown key `protocol`"), "{err}");
}

/// A tool's settings (`gelo embed`): its flags over `GELO_*` over the same defaults, with no
/// file, and none of the service's other variables read.
#[test]
fn tools_read_the_protocol_keys_alone() {
    let sources = Sources {
        file: None,
        env: env(&[
            ("GELO_ENGINE", "vulkan"),
            ("GELO_VERIFY_PROBES", "0"),
            ("GELO_SHIELD_ENERGY", "2.5"),
            ("GELO_PROTECTION", "Masked"),
            ("GELO_MODEL", "ignored"),
            ("GELO_MAX_QUEUE", "not a number, and not a key here"),
        ]),
        flags: json!({ "engine": "cpu", "mask": "hd3-blocked" }),
    };
    let cfg = ProtocolConfig::load(&sources).unwrap();
    let want = ProtocolConfig {
        engine: "cpu".into(),
        mask: MaskKind::Hd3Blocked,
        verify_probes: 0,
        shield_energy: 2.5,
        protection: Protection::Masked,
        ..ProtocolConfig::default()
    };
    assert_eq!(cfg, want);
    assert!(cfg.masked_config().verify.is_none() && cfg.masked_config().shield.rows == 8);
    let none = Sources { file: None, env: vec![], flags: json!({}) };
    assert_eq!(ProtocolConfig::load(&none).unwrap(), ServiceConfig::default().protocol);

    // A flag that is no protocol key is a mistake of the caller, not left unread.
    let stray = Sources { file: None, env: vec![], flags: json!({ "max-queue": 3 }) };
    let err = ProtocolConfig::load(&stray).unwrap_err().to_string();
    assert!(err.contains("max-queue"), "{err}");
}
