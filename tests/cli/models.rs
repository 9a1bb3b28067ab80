//! Model folders and files: HF checkpoint folders load or fail naming the problem, bad GGUF files
//! and model types are refused clearly.

use super::{fails, generate_json, ids};
use reference::ModelConfig;
use reference::io::builtin::random_source;
use reference::io::checkpoint::write_f32_safetensors;
use safetensors::Dtype;
use std::path::Path;

/// A 2-layer HF checkpoint folder of the `tiny` shape: `config.json` and `model.safetensors`.
fn hf_config() -> (String, ModelConfig) {
    let text = r#"{"model_type": "llama", "hidden_act": "silu", "vocab_size": 320, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true}"#;
    let config = ModelConfig::from_hf_json(text, "config.json").unwrap();
    (text.to_string(), config)
}

/// The folder's tensors, sorted by name, as (name, shape, data).
fn hf_tensors(config: &ModelConfig) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut tensors: Vec<_> = random_source(config, 1)
        .tensors
        .into_iter()
        .map(|(name, t)| (name, t.shape, t.data))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

fn write_folder(
    dir: &Path,
    config_text: &str,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config_text).unwrap();
    write_f32_safetensors(&dir.join("model.safetensors"), tensors, None).unwrap();
    dir.to_str().unwrap().to_string()
}

const K_PROJ: &str = "model.layers.1.self_attn.k_proj.weight";

#[test]
fn checkpoint_folders_load_or_fail_naming_the_problem() {
    let root = tempfile::tempdir().unwrap();
    let (text, config) = hf_config();
    let tensors = hf_tensors(&config);

    let good = write_folder(&root.path().join("good"), &text, &tensors);
    let g = generate_json(&[
        "--model",
        &good,
        "--tokens",
        "1,2,3",
        "--max-new-tokens",
        "3",
    ]);
    assert_eq!(ids(&g["tokens"]).len(), 3);
    assert!(g["text"].is_null(), "no tokenizer.json, no text");
    fails(
        &["generate", "--model", &good, "--prompt", "hi"],
        &["no tokenizer", "--tokens"],
    );

    let corrupt = write_folder(
        &root.path().join("corrupt_config"),
        "{\"model_type\": \"llama\",",
        &tensors,
    );
    fails(
        &["generate", "--model", &corrupt, "--tokens", "1"],
        &["config.json", "not valid JSON"],
    );

    let truncated = write_folder(&root.path().join("truncated"), &text, &tensors);
    let st = Path::new(&truncated).join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    fails(
        &["generate", "--model", &truncated, "--tokens", "1"],
        &["model.safetensors", "corrupt"],
    );

    let mut wrong = tensors.clone();
    let k = wrong.iter_mut().find(|t| t.0 == K_PROJ).unwrap();
    k.1 = vec![64, 32];
    let wrong = write_folder(&root.path().join("wrong_shape"), &text, &wrong);
    fails(
        &["generate", "--model", &wrong, "--tokens", "1"],
        &[K_PROJ, "[64, 32]", "[32, 64]", "model.safetensors"],
    );

    let missing: Vec<_> = tensors.iter().filter(|t| t.0 != K_PROJ).cloned().collect();
    let missing = write_folder(&root.path().join("missing"), &text, &missing);
    fails(
        &["generate", "--model", &missing, "--tokens", "1"],
        &[K_PROJ, "missing"],
    );

    // The same bytes, one tensor declared I32.
    let dir = root.path().join("int32");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), &text).unwrap();
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.2.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            let dtype = if name == K_PROJ {
                Dtype::I32
            } else {
                Dtype::F32
            };
            (
                name.clone(),
                safetensors::tensor::TensorView::new(dtype, shape.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    fails(
        &[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            "1",
        ],
        &[K_PROJ, "unsupported dtype", "I32"],
    );

    let empty = root.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    fails(
        &["info", "--model", empty.to_str().unwrap()],
        &["not a Hugging Face checkpoint folder (it has no config.json)"],
    );
}

/// A model checkpoint, M2R2 weights and an export are told apart by the file each holds: one given
/// in another's place is refused saying what it is and which flag takes it.
#[test]
fn folders_given_in_the_wrong_place_say_what_they_are() {
    let root = tempfile::tempdir().unwrap();
    let weights = root.path().join("weights");
    super::ok(&["init-m2r2", "--out", weights.to_str().unwrap()]);
    let w = weights.to_str().unwrap();
    fails(
        &["generate", "--model", w, "--tokens", "1"],
        &[
            "not a Hugging Face checkpoint folder",
            "is an M2R2 weights folder (m2r2_config.json): pass it as `--m2r2",
        ],
    );
    fails(
        &["run", "--onnx", w, "--tokens", "1"],
        &["is an M2R2 weights folder", "--m2r2"],
    );
    let export = root.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("m2r2_export.json"), "{}").unwrap();
    let e = export.to_str().unwrap();
    fails(
        &["generate", "--m2r2", e, "--tokens", "1"],
        &[
            "not an M2R2 weights folder (it has no m2r2_config.json)",
            "is an m2r2 ONNX export (m2r2_export.json): decode it with `m2r2 run --onnx",
        ],
    );
    fails(
        &["info", "--model", e],
        &["is an m2r2 ONNX export", "run --onnx"],
    );
}

#[test]
fn bad_gguf_files_and_model_types_are_refused_clearly() {
    let root = tempfile::tempdir().unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/quant_types.gguf");
    let bytes = std::fs::read(&fixture).unwrap();

    let truncated = root.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    fails(
        &["info", "--model", truncated.to_str().unwrap()],
        &["truncated.gguf"],
    );

    let garbage = root.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all").unwrap();
    fails(
        &["info", "--model", garbage.to_str().unwrap()],
        &["garbage.gguf"],
    );

    // A valid GGUF that holds no llama model (the dequantisation fixture).
    fails(
        &["info", "--model", fixture.to_str().unwrap()],
        &["quant_types.gguf"],
    );

    let (text, config) = hf_config();
    let gpt2 = text.replace("\"llama\"", "\"gpt2\"");
    let dir = write_folder(&root.path().join("gpt2"), &gpt2, &hf_tensors(&config));
    fails(
        &["info", "--model", &dir],
        &["config.json", "unsupported model_type `gpt2`"],
    );
}
