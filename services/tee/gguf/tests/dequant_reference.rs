//! Dequantization against the `gguf` Python package (llama.cpp's numpy reader), fixtures
//! written by scripts/reference/gguf_dequant_fixtures.py.

mod common;

use common::{close, fixture_path, model_path, read_json};
use gguf::{Array, GgufFile, Value};

const REL: f64 = 1e-6;

fn check_real_model(fixture: &str) {
    let doc = read_json(fixture_path(fixture));
    let f = GgufFile::open(model_path(doc["model_file"].as_str().unwrap())).unwrap();
    let tensors = doc["tensors"].as_array().unwrap();
    assert!(!tensors.is_empty());
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let info = f.tensor_info(name).unwrap();
        assert_eq!(info.dtype.to_string(), t["type"].as_str().unwrap(), "{name}");
        let ne: Vec<u64> = t["ne"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(info.ne, ne, "{name}");
        let shape: Vec<usize> = t["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(info.shape(), shape, "{name}");

        let data = f.tensor_f32(name).unwrap();
        assert_eq!(data.len(), info.n_elements(), "{name}");
        let sum: f64 = data.iter().map(|&v| v as f64).sum();
        let sum_sq: f64 = data.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let (ref_sum, ref_sq) = (t["sum"].as_f64().unwrap(), t["sum_sq"].as_f64().unwrap());
        // The sum may nearly cancel; measure its error against the tensor's norm.
        assert!(close(sum, ref_sum, REL, ref_sq.sqrt()), "{name}: sum {sum} vs {ref_sum}");
        assert!(close(sum_sq, ref_sq, REL, 0.0), "{name}: sum of squares {sum_sq} vs {ref_sq}");
        let mut exact = 0;
        let samples = t["samples"].as_array().unwrap();
        for s in samples {
            let (i, v, bits) = (s[0].as_u64().unwrap() as usize, s[1].as_f64().unwrap(), s[2].as_u64().unwrap());
            assert!(close(data[i] as f64, v, REL, 1e-12), "{name}[{i}]: {} vs {v}", data[i]);
            exact += usize::from(data[i].to_bits() as u64 == bits);
        }
        // We follow ggml's operation order, so agreement is bit-exact, not just close.
        assert_eq!(exact, samples.len(), "{name}: {exact} of {} samples bit-exact", samples.len());
    }
}

#[test]
fn smollm2_matches_gguf_py() {
    check_real_model("dequant_smollm2-135m-instruct.json");
}

#[test]
fn qwen25_matches_gguf_py() {
    check_real_model("dequant_qwen2.5-coder-0.5b-instruct-q4_k_m.json");
}

/// Random block bytes of every supported type (all bit patterns of the quants), dequantized
/// by gguf-py: every value must agree.
#[test]
fn synthetic_blocks_of_every_type() {
    let doc = read_json(fixture_path("synthetic.json"));
    let f = GgufFile::open(fixture_path("synthetic.gguf")).unwrap();
    assert_eq!(f.alignment(), doc["alignment"].as_u64().unwrap());
    assert_eq!(f.data_offset() % 64, 0);
    let tensors = doc["tensors"].as_array().unwrap();
    assert_eq!(f.tensors().len(), tensors.len());
    let mut types = std::collections::BTreeSet::new();
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let info = f.tensor_info(name).unwrap();
        assert_eq!(info.dtype.to_string(), t["type"].as_str().unwrap());
        let ne: Vec<u64> = t["ne"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(info.ne, ne, "{name}");
        types.insert(info.dtype.to_string());
        let data = f.tensor_f32(name).unwrap();
        let expected: Vec<f32> =
            t["bits"].as_array().unwrap().iter().map(|b| f32::from_bits(b.as_u64().unwrap() as u32)).collect();
        assert_eq!(data.len(), expected.len(), "{name}");
        for (i, (&a, &b)) in data.iter().zip(&expected).enumerate() {
            // Same operation order as ggml: bit-exact, not just within 1e-6.
            assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: {a} vs {b}");
        }
    }
    assert_eq!(types.len(), 14, "types covered: {types:?}");
}

#[test]
fn synthetic_metadata_of_every_value_type() {
    let f = GgufFile::open(fixture_path("synthetic.gguf")).unwrap();
    let m = f.metadata();
    assert_eq!(m.get("test.u8"), Some(&Value::U8(200)));
    assert_eq!(m.get("test.i8"), Some(&Value::I8(-100)));
    assert_eq!(m.get("test.u16"), Some(&Value::U16(60000)));
    assert_eq!(m.get("test.i16"), Some(&Value::I16(-30000)));
    assert_eq!(m.get_u32("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(m.get("test.i32"), Some(&Value::I32(-2_000_000_000)));
    assert_eq!(m.get_u64("test.u64").unwrap(), (1u64 << 63) + 5);
    assert_eq!(m.get_i64("test.i64").unwrap(), -(1i64 << 62));
    assert_eq!(m.get_f32("test.f32").unwrap(), 0.15625);
    assert_eq!(m.get("test.f64"), Some(&Value::F64(1e-300)));
    assert!(m.get_bool("test.bool").unwrap());
    assert_eq!(m.get_str("test.string").unwrap(), "héllo ✓ 世界");
    assert_eq!(m.get_i32_array("test.array_i32").unwrap(), &[1, -2, 3]);
    assert_eq!(m.get_str_array("test.array_str").unwrap(), &["a", "", "ĠĠ"]);
    assert_eq!(m.get_f32_array("test.array_f32").unwrap(), &[0.5, -1.25]);
    assert_eq!(
        m.get_array("test.array_nested").unwrap(),
        &Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])])
    );
    assert_eq!(m.get_u32("general.alignment").unwrap(), 64);

    // Typed getters name the key and both types on a mismatch.
    let err = m.get_u32("test.i32").unwrap_err().to_string();
    assert!(err.contains("test.i32") && err.contains("i32"), "{err}");
    let err = m.get_str("test.u8").unwrap_err().to_string();
    assert!(err.contains("test.u8") && err.contains("string"), "{err}");
    assert!(m.get_str("no.such.key").unwrap_err().to_string().contains("no.such.key"));
    assert_eq!(m.opt_u32("no.such.key").unwrap(), None);
    assert!(m.opt_bool("test.string").is_err());
}
