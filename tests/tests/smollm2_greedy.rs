//! Tier-5 end-to-end: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to f32) must reproduce exactly the
//! tokens Hugging Face transformers generates greedily, from the same prompt ids, and its logits to
//! [`ATOL`]. Fixtures: `tests/fixtures/smollm2/greedy_{chat,plain}.json`, made by
//! `scripts/fixtures/make_smollm2_greedy.py`.
//!
//! The model must be in the cache (`m2r2 fetch smollm2`); without it every test here FAILS with the
//! message of `reference::io::hub::require_smollm2()`, never skips.

use m2r2_tests::{assert_all_ok, check_close, fixture_dir, read_json};
use ndarray::Array2;
use reference::io::load::LoadedModel;
use reference::io::tokenizer::{ChatMessage, Tokenizer};
use serde_json::Value;
use std::sync::OnceLock;

/// Max abs difference allowed on SmolLM2 logits (values up to ~35). Both sides run the same f32
/// weights (transformers dequantises the GGUF to f32 exactly as we do), so the only difference is the
/// order of f32 reductions over 30 layers (dot products of length 576 and 1536, softmax sums).
/// The fixture's `f64_noise` bounds how far HF's f32 logits are from a float64 run of the same weights,
/// over every position and vocab id: 6.4e-5 (chat) and 5.4e-5 (plain). Ours is another f32 run with
/// its own rounding, so up to about twice that is expected; measured: 2.3e-5 on the teacher-forced
/// `[8, 16]` block, 9.5e-6 on the top-5 logits. 5e-4 leaves 4x headroom over the worst expected case
/// and stays far below what a real mistake moves (a wrong RMSNorm eps or RoPE base moves logits by
/// more than 1e-2) and below the smallest greedy margin (0.07), so token equality and this tolerance
/// cannot contradict each other.
const ATOL: f32 = 5e-4;

fn smollm2() -> &'static LoadedModel {
    static LOADED: OnceLock<LoadedModel> = OnceLock::new();
    LOADED.get_or_init(|| {
        if let Err(e) = reference::io::hub::require_smollm2() {
            panic!("{e}");
        }
        reference::io::load::load_model("smollm2")
            .unwrap_or_else(|e| panic!("loading smollm2: {e}"))
    })
}

fn tokenizer() -> &'static Tokenizer {
    smollm2().tokenizer().unwrap_or_else(|e| panic!("{e}"))
}

fn fixture(name: &str) -> Value {
    read_json(&fixture_dir().join("smollm2").join(name))
}

fn ids(v: &Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("fixture field `{key}` must be a list"))
        .iter()
        .map(|x| x.as_u64().expect("token id") as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("a list of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("fixture field `{key}` must be a string"))
}

/// Greedy decoding with the fixture's prompt, budget and stop ids.
fn our_greedy(f: &Value) -> Vec<u32> {
    let max_new = f["max_new_tokens"].as_u64().expect("max_new_tokens") as usize;
    reference::base::generate::greedy(
        &smollm2().model,
        &ids(f, "prompt_ids"),
        max_new,
        &ids(f, "stop_ids"),
    )
    .expect("greedy generation")
}

/// The logits of the step that produced the last generated token, from one teacher-forced pass.
///
/// # Shapes
/// -> `[V]`
fn last_step_logits(f: &Value) -> Vec<f32> {
    let generated = ids(f, "generated_ids");
    let mut seq = ids(f, "prompt_ids");
    seq.extend_from_slice(&generated[..generated.len() - 1]);
    let logits = smollm2()
        .model
        .teacher_forced_logits(&seq)
        .expect("forward");
    logits.row(logits.nrows() - 1).to_vec()
}

/// Top-5 ids equal HF's (order included) and their logits agree to ATOL.
fn check_top5(label: &str, f: &Value) {
    let logits = last_step_logits(f);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top: Vec<u32> = order[..5].iter().map(|&i| i as u32).collect();
    let want_ids = ids(&f["last_step_top5"], "ids");
    let want = floats(&f["last_step_top5"]["values"]);
    let got: Vec<f32> = want_ids.iter().map(|&i| logits[i as usize]).collect();
    let check = check_close(
        &format!("{label}: last-step top-5 logits"),
        Array2::from_shape_vec((1, 5), want).expect("5").view(),
        Array2::from_shape_vec((1, 5), got).expect("5").view(),
        ATOL,
    );
    assert_eq!(top, want_ids, "{label}: top-5 ids of the last step");
    assert_all_ok(&[check]);
}

#[test]
fn chat_prompt_matches_hf() {
    let f = fixture("greedy_chat.json");
    let messages: Vec<ChatMessage> = f["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| ChatMessage {
            role: str_of(m, "role").into(),
            content: str_of(m, "content").into(),
        })
        .collect();
    let text = tokenizer()
        .apply_chat_template(&messages, true)
        .expect("chat template");
    assert_eq!(text, str_of(&f, "prompt_text"), "rendered chat template");
    let prompt = tokenizer().encode(&text, false).expect("encode");
    assert_eq!(
        prompt,
        ids(&f, "prompt_ids"),
        "prompt ids of the rendered template"
    );
}

#[test]
fn chat_greedy_matches_hf() {
    let f = fixture("greedy_chat.json");
    let stop = ids(&f, "stop_ids");
    for id in &stop {
        assert!(
            smollm2().stop_tokens().contains(id),
            "stop id {id} of HF is not one of ours"
        );
    }
    let ours = our_greedy(&f);
    assert_eq!(
        ours,
        ids(&f, "generated_ids"),
        "greedy ids (HF stops at {stop:?})"
    );
    let text = tokenizer().decode(&ours, true).expect("decode");
    assert_eq!(text, str_of(&f, "generated_text"));
}

#[test]
fn chat_last_step_logits_match_hf() {
    check_top5("chat", &fixture("greedy_chat.json"));
}

#[test]
fn plain_greedy_matches_hf() {
    let f = fixture("greedy_plain.json");
    let prompt = tokenizer()
        .encode(str_of(&f, "prompt_text"), false)
        .expect("encode");
    assert_eq!(
        prompt,
        ids(&f, "prompt_ids"),
        "prompt ids (no special tokens)"
    );
    let ours = our_greedy(&f);
    assert_eq!(ours, ids(&f, "generated_ids"), "greedy ids");
    assert_eq!(
        tokenizer().decode(&ours, true).expect("decode"),
        str_of(&f, "generated_text")
    );
    check_top5("plain", &f);
}

/// Teacher-forced logits of the plain prompt's first 8 positions at 16 vocab ids.
#[test]
fn plain_teacher_forced_logits_match_hf() {
    let f = fixture("greedy_plain.json");
    let tf = &f["teacher_forced"];
    let positions = tf["positions"].as_u64().expect("positions") as usize;
    let vocab_ids = ids(tf, "vocab_ids");
    let rows: Vec<f32> = tf["logits"]
        .as_array()
        .expect("logits")
        .iter()
        .flat_map(floats)
        .collect();
    let want =
        Array2::from_shape_vec((positions, vocab_ids.len()), rows).expect("[positions, ids]");

    let logits = smollm2()
        .model
        .teacher_forced_logits(&ids(&f, "prompt_ids"))
        .expect("forward");
    let got = Array2::from_shape_fn(want.raw_dim(), |(t, j)| logits[[t, vocab_ids[j] as usize]]);
    assert_all_ok(&[check_close(
        "plain: teacher-forced logits [8, 16]",
        want.view(),
        got.view(),
        ATOL,
    )]);
}
