//! Model folders and files: HF checkpoint folders load or fail naming the problem, bad GGUF files
//! and model types are refused clearly.

use super::{fails, generate_json, ids, ok};
use reference::ModelConfig;
use reference::base::weight_names::{AttnProj, WeightId};
use reference::io::builtin::{BUILTIN_VOCAB, random_source};
use reference::io::checkpoint::write_f32_safetensors;
use reference::io::gguf::builder::Builder;
use reference::io::tokenizer::Tokenizer;
use safetensors::Dtype;
use std::collections::HashMap;
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

/// Metadata keys added to a GGUF [`write_gguf`] writes.
type Edit = fn(Builder) -> Builder;

/// The checkpoint as llama.cpp's converter writes it: GGUF names, dims reversed, q/k rows
/// permuted; the built-in byte-level vocabulary as its tokenizer. `edit` adds metadata keys.
fn write_gguf(
    path: &Path,
    config: &ModelConfig,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    edit: Edit,
) -> String {
    let tokenizer = Tokenizer::byte_level_builtin(BUILTIN_VOCAB).unwrap();
    let tokens: Vec<String> = (0..BUILTIN_VOCAB as u32)
        .map(|id| tokenizer.id_to_token(id).unwrap())
        .collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let n = |v: usize| v as u32;
    let mut b = edit(
        Builder::default()
            .kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", n(config.num_hidden_layers))
            .kv_u32("llama.context_length", n(config.max_position_embeddings))
            .kv_u32("llama.embedding_length", n(config.hidden_size))
            .kv_u32("llama.feed_forward_length", n(config.intermediate_size))
            .kv_u32("llama.attention.head_count", n(config.num_attention_heads))
            .kv_u32(
                "llama.attention.head_count_kv",
                n(config.num_key_value_heads),
            )
            .kv_f32(
                "llama.attention.layer_norm_rms_epsilon",
                config.rms_norm_eps as f32,
            )
            .kv_f32("llama.rope.freq_base", config.rope_theta as f32)
            .kv_str("tokenizer.ggml.model", "gpt2")
            .kv_str_array("tokenizer.ggml.tokens", &tokens)
            .kv_str_array("tokenizer.ggml.merges", &[]),
    );
    let ids: HashMap<String, WeightId> = WeightId::all(config)
        .into_iter()
        .map(|id| (id.hf_name(), id))
        .collect();
    for (name, shape, data) in tensors {
        let id = ids[name];
        let data = match id {
            WeightId::Attn(_, AttnProj::Q) => {
                permute_rows(data, shape[0], config.num_attention_heads)
            }
            WeightId::Attn(_, AttnProj::K) => {
                permute_rows(data, shape[0], config.num_key_value_heads)
            }
            _ => data.clone(),
        };
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        b = b.tensor_f32(&id.gguf_name().unwrap(), &dims, &data);
    }
    std::fs::write(path, b.build()).unwrap();
    path.to_str().unwrap().to_string()
}

/// llama.cpp's q/k row order: within each head of `Dh` rows, HF row `i * Dh/2 + j` goes to
/// `2j + i` (the reader's `unpermute_rows` undoes it).
fn permute_rows(data: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    let (cols, dh) = (data.len() / rows, rows / heads);
    let mut out = vec![0.0; data.len()];
    for row in 0..rows {
        let (head, i, j) = (row / dh, row % dh / (dh / 2), row % (dh / 2));
        let to = head * dh + 2 * j + i;
        out[to * cols..(to + 1) * cols].copy_from_slice(&data[row * cols..(row + 1) * cols]);
    }
    out
}

/// The logits `m2r2 logits` writes for `model` on a few tokens, as bytes.
fn logits_bytes(model: &str, out: &Path) -> Vec<u8> {
    let o = out.to_str().unwrap();
    ok(&[
        "logits",
        "--model",
        model,
        "--tokens",
        "1,2,3,4,5,6",
        "--out",
        o,
    ]);
    let bytes = std::fs::read(out).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensor("logits").unwrap().data().to_vec()
}

/// A GGUF of the checkpoint gives its logits bit for bit, and llama.cpp's linear RoPE scaling
/// (`rope.scaling.factor`, with type `linear` or none given) those of HF's `linear` rope type.
#[test]
fn gguf_files_give_the_checkpoints_logits() {
    let root = tempfile::tempdir().unwrap();
    let (text, config) = hf_config();
    let tensors = hf_tensors(&config);
    let logits = |model: &str| {
        let name = Path::new(model).file_name().unwrap().to_str().unwrap();
        logits_bytes(
            model,
            &root.path().join(format!("{name}.logits.safetensors")),
        )
    };
    let hf = write_folder(&root.path().join("hf"), &text, &tensors);
    let gguf = write_gguf(&root.path().join("plain.gguf"), &config, &tensors, |b| b);
    let plain = logits(&hf);
    assert_eq!(logits(&gguf), plain);

    let scaled = text.replace(
        r#""rope_theta": 10000.0"#,
        r#""rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}"#,
    );
    let want = logits(&write_folder(
        &root.path().join("hf_linear"),
        &scaled,
        &tensors,
    ));
    assert_ne!(want, plain);
    let edits: [(&str, Edit); 2] = [
        ("factor.gguf", |b| {
            b.kv_f32("llama.rope.scaling.factor", 4.0)
        }),
        ("linear.gguf", |b| {
            b.kv_str("llama.rope.scaling.type", "linear")
                .kv_f32("llama.rope.scaling.factor", 4.0)
        }),
    ];
    for (name, edit) in edits {
        let gguf = write_gguf(&root.path().join(name), &config, &tensors, edit);
        assert_eq!(logits(&gguf), want, "{name}");
    }
}

/// GGUF problems are named as the file names them: the metadata key, the tensor (with its HF
/// name), the chat template's key; ggml's trailing dims of 1 and an upper-case `.GGUF` are
/// accepted.
#[test]
fn gguf_problems_name_the_key_or_tensor_and_the_file() {
    let root = tempfile::tempdir().unwrap();
    let (_, config) = hf_config();
    let tensors = hf_tensors(&config);
    let gguf = |name: &str, config: &ModelConfig, tensors: &[_], edit: Edit| {
        write_gguf(&root.path().join(name), config, tensors, edit)
    };
    let refused = |path: &str, needles: &[&str]| {
        let mut all = vec![Path::new(path).file_name().unwrap().to_str().unwrap()];
        all.extend_from_slice(needles);
        fails(&["generate", "--model", path, "--tokens", "1"], &all);
    };

    // settings that would load and make every logit NaN
    let mut bad = config.clone();
    bad.rms_norm_eps = -1e-5;
    refused(
        &gguf("eps.gguf", &bad, &tensors, |b| b),
        &[
            "`llama.attention.layer_norm_rms_epsilon` is -",
            "a finite number 0 or more",
        ],
    );
    for (name, theta) in [("zero.gguf", 0.0), ("nan.gguf", f64::NAN)] {
        let mut bad = config.clone();
        bad.rope_theta = theta;
        let want = format!("`llama.rope.freq_base` is {theta}: it must be a finite number more");
        refused(&gguf(name, &bad, &tensors, |b| b), &[&want]);
    }
    let attn = gguf("attn.gguf", &config, &tensors, |b| {
        b.kv_f32("llama.rope.scaling.attn_factor", 2.0)
    });
    refused(&attn, &["`llama.rope.scaling.attn_factor` = 2"]);

    // tensors: both names, no nesting
    let with = |name: &str, shape: Vec<usize>, value: Option<f32>| {
        let mut t = tensors.clone();
        let entry = t.iter_mut().find(|t| t.0 == name).unwrap();
        entry.1 = shape;
        if let Some(v) = value {
            entry.2[5] = v;
        }
        t
    };
    for (hf, gguf_name) in [("k_proj", "attn_k"), ("v_proj", "attn_v")] {
        let name = format!("model.layers.1.self_attn.{hf}.weight");
        let path = gguf(
            &format!("{hf}.gguf"),
            &config,
            &with(&name, vec![64, 32], None),
            |b| b,
        );
        let want = format!(
            "tensor `blk.1.{gguf_name}.weight` ({name}) has shape [64, 32], expected [32, 64]"
        );
        refused(&path, &[&want]);
    }
    let v = "model.layers.1.self_attn.v_proj.weight";
    let nan = gguf(
        "nan_v.gguf",
        &config,
        &with(v, vec![32, 64], Some(f32::NAN)),
        |b| b,
    );
    refused(
        &nan,
        &[&format!(
            "tensor `blk.1.attn_v.weight` ({v}) holds a non-finite value (NaN)"
        )],
    );

    let norm = with("model.norm.weight", vec![1, 64], None);
    let upper = gguf("model.GGUF", &config, &norm, |b| b);
    let g = generate_json(&[
        "--model",
        &upper,
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "2",
    ]);
    assert_eq!(ids(&g["tokens"]).len(), 2);

    // a chat template that does not parse: named by its key and file when --chat applies it
    let broken = gguf("template.gguf", &config, &tensors, |b| {
        b.kv_str(
            "tokenizer.chat_template",
            "{% for m in messages %}{{ m.content",
        )
    });
    fails(
        &["generate", "--model", &broken, "--chat", "--prompt", "hi"],
        &[&format!(
            "chat template (GGUF key `tokenizer.chat_template` in {broken}): syntax error"
        )],
    );
    // and `info` says so before any --chat
    let info = ok(&["info", "--model", &broken]).stdout;
    assert!(
        info.contains("chat template does not parse (GGUF key `tokenizer.chat_template` in"),
        "{info}"
    );
}

/// `logits` generates nothing: a prompt past the context is told to shorten, not to ask for
/// fewer new tokens.
#[test]
fn logits_past_the_context_says_to_shorten_the_prompt() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("l.safetensors");
    let tokens = vec!["1"; 513].join(",");
    let run = fails(
        &[
            "logits",
            "--model",
            "tiny",
            "--tokens",
            &tokens,
            "--out",
            out.to_str().unwrap(),
        ],
        &["the prompt has 513 tokens but the context holds 512: shorten the prompt"],
    );
    assert!(!run.stderr.contains("new tokens"), "{}", run.stderr);
}

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

/// An untied config over a checkpoint without `lm_head.weight` is told why the head is wanted
/// (the tie flag), not the layer count.
#[test]
fn an_untied_config_without_its_head_names_the_tie_flag() {
    let src = m2r2_tests::fixture_dir().join("hf").join("llama_gqa_tied");
    let dir = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["tie_word_embeddings"] = false.into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    fails(
        &["info", "--model", dir.path().to_str().unwrap()],
        &[
            "tensor `lm_head.weight` is missing: tie_word_embeddings is false",
            "config.json",
        ],
    );
}

/// A Mixtral folder in transformers 5's fused expert layout gives `m2r2 logits` the bytes of the
/// same checkpoint in transformers 4's per-expert layout (the fixture, checked against
/// transformers); one missing a fused tensor is refused naming it.
#[test]
fn fused_mixtral_experts_give_the_checkpoints_logits() {
    use reference::io::fused_experts::fuse_layer;
    let root = tempfile::tempdir().unwrap();
    let src = m2r2_tests::fixture_dir().join("hf").join("mixtral");
    let text = std::fs::read_to_string(src.join("config.json")).unwrap();
    let mut tensors = m2r2_tests::checkpoint_tensors(&src);
    for l in 0..2 {
        fuse_layer(&mut tensors, l, 8).unwrap();
    }
    let fused = write_folder(&root.path().join("fused"), &text, &tensors);
    let out = |name: &str| root.path().join(format!("{name}.logits.safetensors"));
    assert_eq!(
        logits_bytes(&fused, &out("fused")),
        logits_bytes(src.to_str().unwrap(), &out("per_expert"))
    );

    let down = "model.layers.1.mlp.experts.down_proj";
    tensors.retain(|t| t.0 != down);
    let missing = write_folder(&root.path().join("missing"), &text, &tensors);
    fails(
        &["info", "--model", &missing],
        &[&format!("tensor `{down}` is missing"), "model.safetensors"],
    );
}
