//! Our GGUF reader and dequantisation against gguf-py 0.19.0 (an independent implementation), on
//! a small file gguf-py wrote: one tensor per supported ggml type, metadata of every value type.
//! Values must match bit for bit. Fixture and generator: tests/fixtures/gguf/,
//! scripts/fixtures/make_gguf_fixture.py.

use reference::io::gguf::{GgmlType, GgufFile, GgufValue};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gguf")
        .join(name)
}

/// `(name, shape, values)` of one dumped tensor.
type Dumped = (String, Vec<usize>, Vec<f32>);

/// Every tensor in the safetensors dump, plus its `gguf_metadata` JSON.
fn expected() -> (Vec<Dumped>, Value) {
    let path = fixture("quant_types.dequant.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut out = vec![];
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), Dtype::F32, "{name}");
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.push((name, view.shape().to_vec(), values));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let (_, header) = SafeTensors::read_metadata(&bytes).expect("valid safetensors header");
    let json = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("gguf_metadata"))
        .expect("gguf_metadata in the safetensors metadata");
    (
        out,
        serde_json::from_str(json).expect("gguf_metadata is JSON"),
    )
}

#[test]
fn every_type_dequantises_bitwise_like_gguf_py() {
    let file = GgufFile::open(&fixture("quant_types.gguf")).unwrap();
    let (want, _) = expected();
    assert_eq!(want.len(), file.tensor_names().len());
    let mut types_seen = vec![];
    let mut report = vec![];
    for (name, shape, values) in &want {
        let info = file
            .tensor_info(name)
            .unwrap_or_else(|| panic!("tensor {name} missing"));
        types_seen.push(info.ggml_type);
        let got = file.tensor_f32(name).unwrap();
        assert_eq!(&got.shape, shape, "{name}: shape");
        let mismatches = got
            .data
            .iter()
            .zip(values)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let max_diff = got
            .data
            .iter()
            .zip(values)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let status = if mismatches == 0 { "OK" } else { "NOT OK" };
        report.push(format!(
            "{status:6} {name:8} {:5} {shape:?}: {mismatches} of {} differ, max |diff| {max_diff:e}",
            info.ggml_type.name(),
            values.len()
        ));
    }
    let report = report.join("\n");
    println!("{report}");
    assert!(!report.contains("NOT OK"), "\n{report}");
    for ty in reference::io::gguf::dequant::SUPPORTED {
        assert!(types_seen.contains(ty), "the fixture has no {ty} tensor");
    }
    assert!(types_seen.contains(&GgmlType::Q6_K));
}

#[test]
fn metadata_matches_what_gguf_py_wrote() {
    let file = GgufFile::open(&fixture("quant_types.gguf")).unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.alignment, 64);
    assert_eq!(file.get_str("general.architecture").unwrap(), "fixture");
    let (_, meta) = expected();
    let meta = meta.as_object().expect("an object");
    for (key, want) in meta {
        let got = file
            .get(key)
            .unwrap_or_else(|| panic!("metadata {key} missing"));
        assert!(same(got, want), "{key}: {got:?} != {want}");
    }
    assert!(matches!(file.get("fixture.u8"), Some(GgufValue::U8(200))));
    assert!(matches!(file.get("fixture.f64"), Some(GgufValue::F64(_))));
}

fn same(got: &GgufValue, want: &Value) -> bool {
    match (got, want) {
        (GgufValue::Array(_, items), Value::Array(wants)) => {
            items.len() == wants.len() && items.iter().zip(wants).all(|(g, w)| same(g, w))
        }
        (GgufValue::String(s), Value::String(w)) => s == w,
        (GgufValue::Bool(b), Value::Bool(w)) => b == w,
        (GgufValue::F32(_) | GgufValue::F64(_), Value::Number(n)) => got.as_float() == n.as_f64(),
        (_, Value::Number(n)) => got
            .as_integer()
            .is_some_and(|i| Some(i) == n.as_i64().map(i128::from)),
        _ => false,
    }
}
