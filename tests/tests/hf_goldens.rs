//! Tier-2 goldens: small random HF models (Llama, Mistral, Qwen2, Mixtral) and the logits Hugging Face
//! transformers computes for them, made by `scripts/fixtures/make_hf_goldens.py` (versions pinned in
//! `scripts/fixtures/requirements.txt`). The reference must match to 1e-4 absolute, f32 against f32.
//!
//! Each `tests/fixtures/hf/<name>/` holds `config.json` + `model.safetensors` (HF `save_pretrained`)
//! and `golden.safetensors`:
//! - `input_ids`: I64 `[T]` (T = 12)
//! - `logits`: F32 `[T, V]`, one teacher-forced forward of the whole sequence
//! - `logits_incremental`: F32 `[T, V]`, HF's own cache: the first 5 tokens, then one at a time
//! - mixtral only: `expert_indices` I64 `[N, T, k]`, `expert_weights` F32 `[N, T, k]`
//!
//! Every comparison prints one OK / NOT OK line with its max abs difference before anything asserts,
//! so one run shows every tensor that disagrees (`cargo test -p m2r2-tests --test hf_goldens --
//! --nocapture`).

use m2r2_tests::{Tensors, assert_all_ok, check_close, fixture_dir, read_fixture};
use ndarray::{Array2, Axis, concatenate};
use reference::golden::TensorCheck;
use reference::{KvCache, Model, ModelConfig};
use std::path::PathBuf;

/// Max abs difference allowed between our logits and HF's: both f32, different reduction orders.
/// HF against itself (full forward vs its cache) differs by up to ~7e-6 on these models.
const ATOL: f32 = 1e-4;
/// `logits_incremental` was made with this prefill, then one token at a time.
const PREFILL: usize = 5;

fn model_dir(name: &str) -> PathBuf {
    fixture_dir().join("hf").join(name)
}

struct Golden {
    /// `[T]`
    input_ids: Vec<u32>,
    /// `[T, V]`
    logits: Array2<f32>,
    /// `[T, V]`
    logits_incremental: Array2<f32>,
}

fn golden(name: &str) -> Golden {
    let t = Tensors::open(&model_dir(name).join("golden.safetensors"));
    Golden {
        input_ids: t.token_ids("input_ids"),
        logits: t.f32_2d("logits"),
        logits_incremental: t.f32_2d("logits_incremental"),
    }
}

fn load(name: &str) -> Model {
    let dir = model_dir(name);
    reference::io::checkpoint::load_hf_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Feed `tokens` in chunks of the given lengths into one cache; the logits of every position.
///
/// # Shapes
/// - `tokens`: `[T]` -> `[T, V]`
fn chunked_logits(model: &Model, tokens: &[u32], chunks: &[usize]) -> Array2<f32> {
    assert_eq!(
        chunks.iter().sum::<usize>(),
        tokens.len(),
        "chunks must cover the sequence"
    );
    let mut cache = KvCache::new(&model.config, tokens.len());
    let mut rows = Vec::new();
    let mut start = 0;
    for &len in chunks {
        assert_eq!(cache.len(), start);
        rows.push(
            model
                .forward(&tokens[start..start + len], &mut cache)
                .expect("forward")
                .logits,
        );
        start += len;
    }
    assert_eq!(cache.len(), tokens.len());
    let views: Vec<_> = rows.iter().map(|r| r.view()).collect();
    concatenate(Axis(0), &views).expect("rows of equal width")
}

/// Teacher-forced, incremental (prefill 5, then 1 by 1) and chunked (5, 4, 3) logits of the
/// reference against HF's teacher-forced logits, and a rollback: truncate to 7 and redo the rest.
fn check_model(name: &str) {
    println!("== {name}");
    let model = load(name);
    let g = golden(name);
    let t = g.input_ids.len();
    let mut checks: Vec<TensorCheck> = Vec::new();

    // HF agrees with itself (documents the noise floor; not a property of our code).
    checks.push(check_close(
        &format!("{name}: HF incremental vs HF full"),
        g.logits.view(),
        g.logits_incremental.view(),
        ATOL,
    ));

    let full = model
        .teacher_forced_logits(&g.input_ids)
        .expect("teacher-forced forward");
    checks.push(check_close(
        &format!("{name}: logits (one chunk)"),
        g.logits.view(),
        full.view(),
        ATOL,
    ));

    let one_by_one: Vec<usize> = std::iter::once(PREFILL)
        .chain(std::iter::repeat_n(1, t - PREFILL))
        .collect();
    let incremental = chunked_logits(&model, &g.input_ids, &one_by_one);
    checks.push(check_close(
        &format!("{name}: logits (prefill {PREFILL}, then 1 by 1)"),
        g.logits.view(),
        incremental.view(),
        ATOL,
    ));

    let chunked = chunked_logits(&model, &g.input_ids, &[5, 4, 3]);
    checks.push(check_close(
        &format!("{name}: logits (chunks 5, 4, 3)"),
        g.logits.view(),
        chunked.view(),
        ATOL,
    ));

    // Rollback: decode everything, move the cache back to 7 positions, recompute the last 5 in one chunk.
    let mut cache = KvCache::new(&model.config, t);
    model.forward(&g.input_ids, &mut cache).expect("forward");
    cache.truncate(7);
    let redo = model
        .forward(&g.input_ids[7..], &mut cache)
        .expect("forward after truncate")
        .logits;
    checks.push(check_close(
        &format!("{name}: logits 7.. after truncate(7)"),
        g.logits.slice(ndarray::s![7.., ..]),
        redo.view(),
        ATOL,
    ));

    assert_all_ok(&checks);
}

#[test]
fn llama_gqa_tied() {
    let config = load("llama_gqa_tied").config;
    assert!(config.tie_word_embeddings && config.num_key_value_heads < config.num_attention_heads);
    check_model("llama_gqa_tied");
}

#[test]
fn llama_untied_bias_head_dim_llama3_rope() {
    let config = load("llama_untied_bias").config;
    assert!(!config.tie_word_embeddings && config.qkv_bias && config.o_bias && config.mlp_bias);
    assert_ne!(
        config.head_dim * config.num_attention_heads,
        config.hidden_size,
        "head_dim must be explicit"
    );
    assert!(
        matches!(
            config.rope_scaling,
            reference::base::config::RopeScaling::Llama3 { .. }
        ),
        "{:?}",
        config.rope_scaling
    );
    check_model("llama_untied_bias");
}

#[test]
fn mistral_sliding_window() {
    let config = load("mistral_window").config;
    assert_eq!(
        config.sliding_window,
        Some(4),
        "the window must be shorter than the 12 tokens"
    );
    check_model("mistral_window");
}

#[test]
fn qwen2_qkv_bias() {
    let config = load("qwen2_bias").config;
    assert!(config.qkv_bias && !config.o_bias && !config.tie_word_embeddings);
    check_model("qwen2_bias");
}

#[test]
fn mixtral_top2_of_8() {
    let config = load("mixtral").config;
    let moe = config.moe.as_ref().expect("mixtral has a MoE config");
    assert_eq!((moe.num_local_experts, moe.num_experts_per_tok), (8, 2));
    check_model("mixtral");
}

/// The experts chosen in every layer and row, and their weights, equal HF's (the script checked that
/// no row is near a tie at the top-2 border, and that all 8 experts are used somewhere).
#[test]
fn mixtral_routing_matches_hf() {
    let model = load("mixtral");
    let t = Tensors::open(&model_dir("mixtral").join("golden.safetensors"));
    let ids = t.token_ids("input_ids");
    let k = model.config.moe.as_ref().expect("moe").num_experts_per_tok;
    let (n, len) = (model.config.num_hidden_layers, ids.len());
    let hf_experts = t.i64_flat("expert_indices"); // [N, T, k] flattened, in HF's top-k order
    let hf_weights = t.f32_flat("expert_weights");
    assert_eq!(hf_experts.len(), n * len * k);

    let mut cache = KvCache::new(&model.config, len);
    let mut s = model.embed(&ids);
    let mut worst = 0.0f32;
    let mut mismatches = Vec::new();
    for l in 0..n {
        let routing = model
            .layer_forward(l, &mut s, 0, &mut cache)
            .routing
            .expect("a MoE layer returns routing");
        for (row, r) in routing.iter().enumerate() {
            // Both list the experts in top-k order (most probable first).
            let hf: Vec<(usize, f32)> = (0..k)
                .map(|j| {
                    let at = (l * len + row) * k + j;
                    (hf_experts[at] as usize, hf_weights[at])
                })
                .collect();
            let ours: Vec<(usize, f32)> = r
                .experts
                .iter()
                .copied()
                .zip(r.weights.iter().copied())
                .collect();
            let experts_equal = hf.iter().map(|p| p.0).eq(ours.iter().map(|p| p.0));
            if !experts_equal {
                mismatches.push(format!("layer {l} row {row}: HF {hf:?}, ours {ours:?}"));
                continue;
            }
            for (a, b) in hf.iter().zip(&ours) {
                worst = worst.max((a.1 - b.1).abs());
            }
        }
    }
    let ok = mismatches.is_empty() && worst <= 1e-5;
    println!(
        "{} mixtral routing: {} of {} rows choose other experts, max abs weight diff {worst:.3e} (atol 1e-5)",
        if ok { "OK    " } else { "NOT OK" },
        mismatches.len(),
        n * len
    );
    assert!(
        mismatches.is_empty(),
        "routing differs from HF:\n{}",
        mismatches.join("\n")
    );
    assert!(worst <= 1e-5, "routing weights differ from HF by {worst:e}");
}

/// transformers 4 writes `rope_theta` / `rope_scaling` at the top level, transformers 5 writes
/// `rope_parameters`; both spellings of the same model are the same config.
#[test]
fn config_v4_and_v5_parse_equal() {
    let dir = model_dir("llama_gqa_tied");
    let read = |file: &str| {
        let path = dir.join(file);
        let text = String::from_utf8(read_fixture(&path)).expect("UTF-8");
        assert_eq!(
            text.contains("rope_parameters"),
            file == "config.json",
            "{file}: expected the transformers-{} spelling",
            if file == "config.json" { 5 } else { 4 }
        );
        ModelConfig::from_hf_json(&text, &path.display().to_string())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(read("config.json"), read("config_v4.json"));
}

/// The fixtures store some checkpoints in half precision so the f16 / bf16 -> f32 conversion is
/// checked against HF too (HF computed the goldens from the same rounded values, in f32).
#[test]
fn fixtures_cover_f32_f16_and_bf16_checkpoints() {
    for (name, dtype) in [
        ("llama_gqa_tied", safetensors::Dtype::F32),
        ("qwen2_bias", safetensors::Dtype::F16),
        ("mixtral", safetensors::Dtype::BF16),
    ] {
        let bytes = std::fs::read(model_dir(name).join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(
            st.tensors().iter().all(|(_, t)| t.dtype() == dtype),
            "{name}: expected every tensor stored as {dtype:?}"
        );
    }
}
