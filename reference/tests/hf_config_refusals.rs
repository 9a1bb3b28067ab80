//! HF checkpoint folders that transformers would run as another model than the config says, or
//! not at all: the small fixtures of tests/fixtures/hf/ with one setting or tensor changed, each
//! refused at load naming `config.json` (or the tensor's file) and the field. What still loads is
//! checked against the fixture's golden logits, which HF transformers computed.

use reference::base::kv_cache::KvCache;
use reference::base::model::Model;
use reference::base::weights::TensorSource;
use reference::io::checkpoint::{SafetensorsSource, load_hf_dir, write_f32_safetensors};
use safetensors::SafeTensors;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/hf")
        .join(name)
}

/// The fixture's folder with `edit` applied to its config.
fn with_config(name: &str, edit: impl FnOnce(&mut Value)) -> (TempDir, reference::Result<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture(name).join("config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let weights = fixture(name).join("model.safetensors");
    std::fs::copy(weights, dir.path().join("model.safetensors")).unwrap();
    let loaded = load_hf_dir(dir.path());
    (dir, loaded)
}

fn config_error(name: &str, edit: impl FnOnce(&mut Value)) -> String {
    let (dir, loaded) = with_config(name, edit);
    let Err(err) = loaded else {
        panic!("{name}: the edited config loads");
    };
    let err = err.to_string();
    let config = dir.path().join("config.json").display().to_string();
    assert!(err.starts_with(&config), "{err}");
    err
}

fn rope(config: &mut Value, key: &str, value: Value) {
    config["rope_parameters"] = json!({
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
    });
    config["rope_parameters"][key] = value;
}

/// transformers builds Mistral's and Mixtral's projections with `bias=False`, and Qwen2's MLP and
/// `o_proj`, whatever the config says: a true `attention_bias` or `mlp_bias` there is refused
/// (honouring it ran another model than transformers). Llama honours both (`llama_untied_bias`,
/// checked against HF in m2r2-tests), and Qwen2's q/k/v biases load without any flag.
#[test]
fn bias_flags_only_for_llama() {
    for (name, model_type) in [
        ("mistral_window", "mistral"),
        ("mixtral", "mixtral"),
        ("qwen2_bias", "qwen2"),
    ] {
        for key in ["attention_bias", "mlp_bias"] {
            let err = config_error(name, |c| c[key] = json!(true));
            assert!(
                err.contains(&format!(
                    "`{key}` is true, but transformers' `{model_type}` does not read it"
                )),
                "{err}"
            );
            let (_dir, loaded) = with_config(name, |c| c[key] = json!(false));
            loaded.unwrap();
        }
    }
    let (_dir, qwen2) = with_config("qwen2_bias", |_| {});
    let qwen2 = qwen2.unwrap().config;
    assert!(qwen2.qkv_bias && !qwen2.o_bias && !qwen2.mlp_bias);
    let (_dir, llama) = with_config("llama_untied_bias", |_| {});
    let llama = llama.unwrap().config;
    assert!(llama.qkv_bias && llama.o_bias && llama.mlp_bias);
}

/// A window of 0 hides every key (the attention output was 0); negative sizes were already
/// refused as not unsigned.
#[test]
fn sliding_window_must_be_positive() {
    for name in ["mistral_window", "mixtral"] {
        let err = config_error(name, |c| c["sliding_window"] = json!(0));
        assert!(
            err.contains("`sliding_window` is 0: it must be positive"),
            "{err}"
        );
    }
    let (_dir, loaded) = with_config("mistral_window", |c| c["sliding_window"] = json!(1));
    assert_eq!(loaded.unwrap().config.sliding_window, Some(1));
    // qwen2 without `use_sliding_window` does not use the window: its value is not looked at
    let (_dir, loaded) = with_config("qwen2_bias", |c| c["sliding_window"] = json!(0));
    assert_eq!(loaded.unwrap().config.sliding_window, None);
}

/// llama3 RoPE: the original context is a positive integer (16.7 was read as 16, -16 as 0), and
/// the two frequency factors finite and positive with high more than low (the formula divides by
/// each and by their difference).
#[test]
fn llama3_rope_parameters_are_checked() {
    let (_dir, loaded) = with_config("llama_gqa_tied", |c| {
        rope(c, "original_max_position_embeddings", json!(16))
    });
    loaded.unwrap();
    let context = "original_max_position_embeddings";
    for bad in [json!(16.7), json!(-16), json!(0), json!("16"), json!(16.0)] {
        let err = config_error("llama_gqa_tied", |c| rope(c, context, bad.clone()));
        assert!(
            err.contains(&format!(
                "rope parameters need `{context}` as a positive integer, got {bad}"
            )),
            "{err}"
        );
    }
    let cases = [
        ("low_freq_factor", json!(0.0), "`low_freq_factor` is 0"),
        ("low_freq_factor", json!(-1.0), "`low_freq_factor` is -1"),
        ("high_freq_factor", json!(-4.0), "`high_freq_factor` is -4"),
        (
            "high_freq_factor",
            json!(1.0),
            "`high_freq_factor` (1) must be more than `low_freq_factor` (1)",
        ),
        (
            "low_freq_factor",
            json!(8.0),
            "`high_freq_factor` (4) must be more than `low_freq_factor` (8)",
        ),
    ];
    for (key, value, want) in cases {
        let err = config_error("llama_gqa_tied", |c| rope(c, key, value));
        assert!(err.contains(want), "{err}");
    }
}

/// `layer_types` must be a list of strings, one per layer, each the attention the layer runs:
/// `full_attention`, or `sliding_attention` when the config has a window.
#[test]
fn layer_types_are_one_per_layer() {
    let full = json!(["full_attention", "full_attention"]);
    let sliding = json!(["sliding_attention", "sliding_attention"]);
    let loads = |name: &str, types: &Value| {
        let (_dir, loaded) = with_config(name, |c| c["layer_types"] = types.clone());
        loaded.unwrap_or_else(|e| panic!("{name} {types}: {e}"));
    };
    loads("llama_gqa_tied", &full);
    loads("qwen2_bias", &full);
    loads("mistral_window", &sliding);
    loads("mixtral", &full);
    let cases = [
        (
            "llama_gqa_tied",
            json!(3),
            "`layer_types` must be a list of strings",
        ),
        (
            "llama_gqa_tied",
            json!(["full_attention", 1]),
            "must be a list of strings",
        ),
        (
            "llama_gqa_tied",
            json!(["full_attention"]),
            "`layer_types` has 1 entries, expected one per layer: num_hidden_layers = 2",
        ),
        (
            "llama_gqa_tied",
            json!(["full_attention", "chunked_attention"]),
            "`layer_types[1]` is `chunked_attention`: expected one of",
        ),
        (
            "llama_gqa_tied",
            sliding.clone(),
            "`layer_types[0]` is `sliding_attention`, but the config has no sliding window",
        ),
        (
            "mistral_window",
            json!(["sliding_attention", "full_attention"]),
            "`layer_types[1]` is `full_attention`, but the config has a sliding window of 4",
        ),
    ];
    for (name, types, want) in cases {
        let err = config_error(name, |c| c["layer_types"] = types);
        assert!(err.contains(want), "{err}");
    }
}

/// A Mixtral config with fewer experts than its weights names `num_local_experts` among the
/// settings that decide the tensors.
#[test]
fn unused_experts_name_num_local_experts() {
    let err = config_error("mixtral", |c| c["num_local_experts"] = json!(7));
    assert!(
        err.contains("experts.7.")
            && err.contains("(num_hidden_layers = 2, num_local_experts = 7?)"),
        "{err}"
    );
    let err = config_error("llama_gqa_tied", |c| c["num_hidden_layers"] = json!(1));
    assert!(
        err.contains("(num_hidden_layers = 1, attention_bias = false, mlp_bias = false?)"),
        "{err}"
    );
}

/// The tied fixture's folder with an `lm_head.weight` added.
fn with_head(shape: Vec<usize>, data: Vec<f32>) -> (TempDir, reference::Result<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("llama_gqa_tied");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let source = SafetensorsSource::open_dir(&src).unwrap();
    let mut tensors: Vec<_> = source
        .names()
        .into_iter()
        .map(|n| {
            let t = source.read(&n).unwrap().unwrap();
            (n, t.shape, t.data)
        })
        .collect();
    tensors.push(("lm_head.weight".into(), shape, data));
    let path = dir.path().join("model.safetensors");
    write_f32_safetensors(&path, &tensors, None).unwrap();
    let loaded = load_hf_dir(dir.path());
    (dir, loaded)
}

/// `(input_ids, logits)` of the fixture's golden, computed by HF transformers.
fn golden(name: &str) -> (Vec<u32>, Vec<f32>) {
    let bytes = std::fs::read(fixture(name).join("golden.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = st.tensor("input_ids").unwrap();
    let ids = ids.data().chunks_exact(8);
    let ids = ids.map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32);
    let logits = st.tensor("logits").unwrap();
    let logits = logits.data().chunks_exact(4);
    let logits = logits.map(|b| f32::from_le_bytes(b.try_into().unwrap()));
    (ids.collect(), logits.collect())
}

/// With `tie_word_embeddings` the head is the embedding, as in transformers: an `lm_head.weight`
/// of another shape is refused naming it and both shapes; one of the same shape but other values
/// loads (with a warning, `tied_head`'s unit test) and the embedding runs, giving HF's logits.
#[test]
fn a_head_beside_tied_embeddings() {
    let (dir, loaded) = with_head(vec![3, 3], vec![0.0; 9]);
    let Err(err) = loaded else {
        panic!("a [3, 3] lm_head.weight beside tied embeddings loads");
    };
    let err = err.to_string();
    let weights = dir.path().join("model.safetensors").display().to_string();
    assert!(
        err.starts_with(&format!(
            "{weights}: tensor `lm_head.weight` has shape [3, 3], but tie_word_embeddings is true"
        )) && err.contains("`model.embed_tokens.weight` of shape [96, 32]"),
        "{err}"
    );

    let (_dir, loaded) = with_head(vec![96, 32], vec![0.25; 96 * 32]);
    let model = loaded.unwrap();
    let (ids, want) = golden("llama_gqa_tied");
    let mut cache = KvCache::new(&model.config, ids.len());
    let got = model.forward(&ids, &mut cache).unwrap().logits;
    assert_eq!(got.len(), want.len());
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    // the tolerance of m2r2-tests' HF goldens (both f32, different reduction orders)
    assert!(worst < 1e-4, "max |ours - HF| = {worst}");
}
