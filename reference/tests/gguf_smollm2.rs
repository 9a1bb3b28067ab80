//! The real SmolLM2-135M-Instruct Q4_1 GGUF, read by us and by two independent implementations:
//! raw dequantised tensors must equal gguf-py 0.19.0's, and [`GgufSource`] (HF names, q/k rows
//! un-permuted) must equal what transformers 5.23.0's GGUF loader hands to `LlamaForCausalLM`,
//! bit for bit, on the slices in tests/fixtures/smollm2/gguf_slices.safetensors
//! (scripts/fixtures/make_smollm2_gguf_fixture.py).
//!
//! Needs the GGUF in the m2r2 cache (`m2r2 fetch smollm2`); without it the tests fail with the
//! message of [`reference::io::hub::require_smollm2`].

use reference::base::weights::{RawTensor, TensorSource, Weights};
use reference::io::gguf::{GgmlType, GgufFile, GgufSource, config_from_gguf};
use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

fn smollm2() -> GgufFile {
    let path = reference::io::hub::require_smollm2().unwrap_or_else(|e| panic!("{e}"));
    GgufFile::open(&path).unwrap()
}

struct Slice {
    /// `gguf` (raw tensor, gguf-py) or `hf` (transformers)
    source: String,
    tensor: String,
    /// `[row0, row1, col0, col1]`
    region: [usize; 4],
    values: Vec<f32>,
}

/// The slices and transformers' config from the fixture.
fn fixture() -> (Vec<Slice>, Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/smollm2/gguf_slices.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().as_ref().expect("fixture metadata");
    let regions: HashMap<String, [usize; 4]> = serde_json::from_str(&meta["slices"]).unwrap();
    let config: Value = serde_json::from_str(&meta["config"]).unwrap();
    let mut slices = vec![];
    for (key, view) in st.tensors() {
        let (source, rest) = key.split_once('/').unwrap();
        let (tensor, _) = rest.rsplit_once('/').unwrap();
        slices.push(Slice {
            source: source.to_string(),
            tensor: tensor.to_string(),
            region: regions[&key],
            values: view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        });
    }
    slices.sort_by(|a, b| (&a.source, &a.tensor, a.region).cmp(&(&b.source, &b.tensor, b.region)));
    (slices, config)
}

/// `t[r0..r1, c0..c1]` (`t[r0..r1]` for a vector), row-major.
fn cut(t: &RawTensor, [r0, r1, c0, c1]: [usize; 4]) -> Vec<f32> {
    if t.shape.len() == 1 {
        return t.data[r0..r1].to_vec();
    }
    let cols = t.shape[1];
    (r0..r1)
        .flat_map(|r| t.data[r * cols + c0..r * cols + c1].to_vec())
        .collect()
}

#[test]
fn slices_equal_gguf_py_and_transformers_bitwise() {
    let file = smollm2();
    let config = config_from_gguf(&file).unwrap();
    let source = GgufSource::new(&file, &config);
    let (slices, _) = fixture();
    let mut report = vec![];
    for s in &slices {
        let t = match s.source.as_str() {
            "gguf" => file.tensor_f32(&s.tensor).unwrap(),
            "hf" => source
                .read(&s.tensor)
                .unwrap()
                .unwrap_or_else(|| panic!("{} missing", s.tensor)),
            other => panic!("unknown source {other}"),
        };
        let got = cut(&t, s.region);
        assert_eq!(got.len(), s.values.len(), "{} {:?}", s.tensor, s.region);
        let differ = got
            .iter()
            .zip(&s.values)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let max_diff = got
            .iter()
            .zip(&s.values)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        report.push(format!(
            "{:6} {:4} {:44} {:?}: {differ} of {} differ, max |diff| {max_diff:e}",
            if differ == 0 { "OK" } else { "NOT OK" },
            s.source,
            s.tensor,
            s.region,
            got.len()
        ));
    }
    let report = report.join("\n");
    println!("{report}");
    assert!(!report.contains("NOT OK"), "\n{report}");
    // The un-permutation is visible in the fixture: q's raw rows differ from HF's rows.
    let first = |tensor: &str| {
        slices
            .iter()
            .find(|s| s.tensor == tensor)
            .map(|s| &s.values)
    };
    assert_ne!(
        first("blk.0.attn_q.weight"),
        first("model.layers.0.self_attn.q_proj.weight")
    );
}

#[test]
fn config_equals_transformers() {
    let file = smollm2();
    let c = config_from_gguf(&file).unwrap();
    let (_, hf) = fixture();
    let n = |k: &str| {
        hf[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in the HF config")) as usize
    };
    assert_eq!(c.vocab_size, n("vocab_size"));
    assert_eq!(c.hidden_size, n("hidden_size"));
    assert_eq!(c.intermediate_size, n("intermediate_size"));
    assert_eq!(c.num_hidden_layers, n("num_hidden_layers"));
    assert_eq!(c.num_attention_heads, n("num_attention_heads"));
    assert_eq!(c.num_key_value_heads, n("num_key_value_heads"));
    assert_eq!(c.head_dim, n("head_dim"));
    assert_eq!(c.max_position_embeddings, n("max_position_embeddings"));
    assert_eq!(c.rms_norm_eps, hf["rms_norm_eps"].as_f64().unwrap());
    assert_eq!(
        c.rope_theta,
        hf["rope_parameters"]["rope_theta"].as_f64().unwrap()
    );
    assert_eq!(
        c.tie_word_embeddings,
        hf["tie_word_embeddings"].as_bool().unwrap()
    );
    assert_eq!(c.bos_token_id, Some(n("bos_token_id") as u32));
    assert_eq!(c.eos_token_ids, vec![n("eos_token_id") as u32]);
    // SmolLM2-135M: 134.5M parameters.
    assert_eq!(c.parameter_count(), 134_515_008);
}

#[test]
fn every_tensor_loads() {
    let file = smollm2();
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    for info in file.tensor_infos() {
        *types.entry(info.ggml_type.name()).or_default() += 1;
    }
    // What this Q4_1 file really holds: Q4_1 linears, a Q8_0 embedding, F32 norms.
    assert_eq!(
        types,
        BTreeMap::from([("F32", 61), ("Q4_1", 210), ("Q8_0", 1)])
    );
    assert_eq!(
        file.tensor_info("token_embd.weight").unwrap().ggml_type,
        GgmlType::Q8_0
    );

    let config = config_from_gguf(&file).unwrap();
    let weights = Weights::load(&config, &GgufSource::new(&file, &config)).unwrap();
    assert_eq!(weights.layers.len(), 30);
    assert_eq!(weights.embed.dim(), (49152, 576));
    assert!(weights.lm_head.is_none());
    assert!(weights.embed.iter().all(|v| v.is_finite()));
}
