//! Truncated and corrupt files give typed errors that name what is wrong, never a panic.

mod common;

use std::io::Read;

use common::builder::{Builder, string};
use common::{SMOLLM2, fixture_path, model_path};
use gguf::{Error, GgufFile};

fn synthetic() -> Vec<u8> {
    std::fs::read(fixture_path("synthetic.gguf")).unwrap()
}

/// Every prefix of a valid file: an error until the last tensor's data is complete, and
/// the error kind says which part was cut.
#[test]
fn every_truncation_is_an_error() {
    let bytes = synthetic();
    let full = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_end = full.tensors().iter().map(|t| full.data_offset() + t.offset as usize + t.n_bytes()).max().unwrap();
    for n in 0..bytes.len() {
        match GgufFile::from_bytes(bytes[..n].to_vec()) {
            Ok(_) => assert!(n >= data_end, "prefix of {n} bytes parsed, data ends at {data_end}"),
            Err(e) => {
                assert!(n < data_end, "prefix of {n} bytes failed: {e}");
                match e {
                    Error::Truncated { .. } | Error::BadMagic(_) => {}
                    Error::BadTensor { ref name, .. } => {
                        assert!(n >= full.data_offset() - 64, "{n}: {e}");
                        assert!(full.has_tensor(name), "{e}");
                    }
                    other => panic!("prefix of {n} bytes: unexpected {other}"),
                }
            }
        }
    }
}

/// A cheap deterministic generator (no rand dependency needed for byte flips).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Random byte corruptions of the header: parsing and dequantizing whatever still parses
/// must return, Ok or Err, without panicking or allocating absurd amounts.
#[test]
fn random_header_corruption_never_panics() {
    let bytes = synthetic();
    let header_len = GgufFile::from_bytes(bytes.clone()).unwrap().data_offset();
    let mut rng = Lcg(7);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.next() % 4 {
            let at = (rng.next() as usize) % header_len;
            b[at] = match rng.next() % 3 {
                0 => rng.next() as u8,
                1 => 0xFF,
                _ => b[at] ^ (1 << (rng.next() % 8)),
            };
        }
        match GgufFile::from_bytes(b) {
            Ok(f) => {
                ok += 1;
                for t in f.tensors() {
                    let _ = f.tensor_f32(&t.name);
                }
            }
            Err(e) => {
                err += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert!(ok > 0 && err > 0, "ok {ok}, err {err}");
}

#[test]
fn structural_errors_are_typed_and_named() {
    let one =
        Builder::default().kv_str("general.architecture", "llama").tensor_f32("w", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let f = GgufFile::from_bytes(one.build()).unwrap();
    assert_eq!(f.tensor_f32("w").unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert!(matches!(f.tensor_f32("nope"), Err(Error::MissingTensor(n)) if n == "nope"));

    let mut bytes = one.build();
    bytes[0] = b'X';
    assert!(matches!(GgufFile::from_bytes(bytes), Err(Error::BadMagic(_))));

    for version in [1, 4, 0x0300_0000] {
        let b = Builder::with_version(version).build();
        assert!(matches!(GgufFile::from_bytes(b), Err(Error::UnsupportedVersion(v)) if v == version));
    }
    let v2 = Builder::with_version(2).tensor_f32("w", &[1], &[5.0]).build();
    assert_eq!(GgufFile::from_bytes(v2).unwrap().tensor_f32("w").unwrap(), vec![5.0]);

    let err = |b: Builder| GgufFile::from_bytes(b.build()).unwrap_err();
    let named = |e: Error, needle: &str| {
        let msg = e.to_string();
        assert!(msg.contains(needle), "`{msg}` does not name `{needle}`");
    };

    // Unknown value type, bad bool, invalid UTF-8, repeated key.
    named(err(Builder::default().kv_raw("k.type", 99, &[])), "k.type");
    named(err(Builder::default().kv_raw("k.bool", 7, &[2])), "k.bool");
    named(err(Builder::default().kv_raw("k.utf8", 8, &[2, 0, 0, 0, 0, 0, 0, 0, 0xC3, 0x28])), "k.utf8");
    named(err(Builder::default().kv_u32("k.dup", 1).kv_u32("k.dup", 2)), "k.dup");

    // An array claiming 2^60 strings in a tiny file: a truncation error, not an allocation.
    let e = err(Builder::default().kv_array_raw("tokenizer.ggml.tokens", 8, 1 << 60, &string("a")));
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    named(e, "tokenizer.ggml.tokens");
    let e = err(Builder::default().kv_array_raw("k.ints", 5, u64::MAX / 2, &[0; 8]));
    assert!(matches!(e, Error::BadMetadata { .. } | Error::Truncated { .. }), "{e}");
    named(e, "k.ints");
    // Arrays nested past the limit.
    let mut nested = 5u32.to_le_bytes().to_vec();
    nested.extend(1u64.to_le_bytes());
    nested.extend(7i32.to_le_bytes());
    for _ in 0..6 {
        let mut outer = 9u32.to_le_bytes().to_vec();
        outer.extend(1u64.to_le_bytes());
        outer.extend(nested);
        nested = outer;
    }
    named(err(Builder::default().kv_raw("k.deep", 9, &nested)), "k.deep");

    // Tensor infos: unknown type, too many dims, partial blocks, misaligned offset,
    // data past the end, overflowing shape, duplicate name, bad alignment key.
    named(err(Builder::default().tensor_raw("t.type", &[4], 200, None, &[0; 16])), "t.type");
    named(err(Builder::default().tensor_raw("t.dims", &[1, 1, 1, 1, 1], 0, None, &[0; 4])), "t.dims");
    named(err(Builder::default().tensor_raw("t.block", &[48], 8, None, &[0; 64])), "t.block");
    named(err(Builder::default().tensor_raw("t.align", &[1], 0, Some(4), &[])), "t.align");
    named(err(Builder::default().tensor_raw("t.past", &[1024], 0, None, &[0; 16])), "t.past");
    named(err(Builder::default().tensor_raw("t.huge", &[u64::MAX / 2, 4], 0, Some(0), &[])), "t.huge");
    named(err(Builder::default().tensor_f32("t.dup", &[1], &[1.0]).tensor_f32("t.dup", &[1], &[2.0])), "t.dup");
    named(err(Builder::default().kv_u32("general.alignment", 24)), "general.alignment");

    // A type we can place but not dequantize is reported by name.
    let iq = Builder::default().tensor_raw("t.iq2", &[256], 16, None, &[0; 66]).build();
    let f = GgufFile::from_bytes(iq).unwrap();
    assert!(matches!(f.tensor_f32("t.iq2"), Err(Error::UnsupportedType { name, .. }) if name == "t.iq2"));
    assert_eq!(f.tensor_bytes("t.iq2").unwrap().len(), 66);
}

/// Cuts of a real model: inside the token list, and inside the tensor data.
#[test]
fn truncated_real_model_names_the_cut() {
    let mut head = Vec::new();
    std::fs::File::open(model_path(SMOLLM2)).unwrap().take(4 << 20).read_to_end(&mut head).unwrap();
    let e = GgufFile::from_bytes(head[..300_000].to_vec()).unwrap_err();
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("tokenizer.ggml.tokens"), "{e}");
    let e = GgufFile::from_bytes(head).unwrap_err();
    assert!(e.to_string().contains("token_embd.weight"), "{e}");
}

/// Parses `bytes` and, if it parses, dequantizes every tensor: `Some(true)` if all of it
/// worked, `Some(false)` if it parsed but a tensor was refused, `None` if refused at parse.
/// A panic fails the calling test.
fn parse_all(bytes: Vec<u8>) -> Option<bool> {
    let f = GgufFile::from_bytes(bytes).ok()?;
    let names: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
    Some(names.iter().all(|n| f.tensor_f32(n).is_ok()))
}

/// The hidden-input corpus of GGUF headers: every byte position of a valid header
/// overwritten, as a 4-byte and as an 8-byte field, with the values that break parsers (0,
/// 1, all ones, the sign bit, a type id past the table, the file's own length, a length
/// far past it). Every file must parse or be refused with an error; none may panic or
/// allocate what the file's length does not justify.
#[test]
fn hostile_header_corpus_is_refused_or_parsed_never_panics() {
    let bytes = synthetic();
    let header_len = GgufFile::from_bytes(bytes.clone()).unwrap().data_offset();
    let len = bytes.len() as u64;
    let wide: [u64; 7] = [0, 1, u32::MAX as u64, u64::MAX, 1 << 63, len, len << 24];
    let narrow: [u32; 7] = [0, 1, 9, 31, 200, u32::MAX, 1 << 31];
    let (mut files, mut parsed, mut whole) = (0usize, 0usize, 0usize);
    let mut run = |b: Vec<u8>| {
        files += 1;
        if let Some(all) = parse_all(b) {
            parsed += 1;
            whole += usize::from(all);
        }
    };
    for at in 0..header_len {
        for v in wide {
            let mut b = bytes.clone();
            let end = (at + 8).min(b.len());
            b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            run(b);
        }
        for v in narrow {
            let mut b = bytes.clone();
            let end = (at + 4).min(b.len());
            b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            run(b);
        }
    }
    eprintln!(
        "GGUF hostile headers: {files} files from a {header_len}-byte header, {} refused at parse, {parsed} parsed \
         ({whole} with every tensor readable), 0 panics",
        files - parsed
    );
    assert_eq!(files, header_len * 14);
    assert!(files - parsed > files / 4, "most forged fields must be caught: {parsed} of {files} parsed");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

        /// A valid preamble (magic, version, counts) followed by arbitrary bytes: the parser
        /// gets past the magic every time and must refuse or parse without panicking.
        #[test]
        fn arbitrary_bytes_after_a_valid_preamble(
            version in 2u32..=3,
            tensors in prop_oneof![0u64..4, any::<u64>()],
            kvs in prop_oneof![0u64..4, any::<u64>()],
            rest in prop::collection::vec(any::<u8>(), 0..1024),
        ) {
            let mut b = b"GGUF".to_vec();
            b.extend(version.to_le_bytes());
            b.extend(tensors.to_le_bytes());
            b.extend(kvs.to_le_bytes());
            b.extend(rest);
            let _ = parse_all(b);
        }

        /// A valid header with a run of its bytes replaced by arbitrary ones.
        #[test]
        fn arbitrary_runs_inside_a_valid_header(at in any::<prop::sample::Index>(), run in prop::collection::vec(any::<u8>(), 1..24)) {
            let mut b = synthetic();
            let header_len = GgufFile::from_bytes(b.clone()).unwrap().data_offset();
            let at = at.index(header_len);
            for (i, x) in run.iter().enumerate() {
                if let Some(slot) = b.get_mut(at + i) {
                    *slot = *x;
                }
            }
            let _ = parse_all(b);
        }
    }
}
