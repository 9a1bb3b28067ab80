//! Static exports (`m2r2 export --static-cache L`) on ONNX Runtime's CPU provider against the
//! reference (tier 3: the reference is the oracle), through the runner's own in-place loop
//! ([`OnnxModel`] with its fixed buffers bound as past input and present output):
//! - a prefill of the prompt, then decode steps of one token each (the reference's greedy
//!   choice): every step's logits within [`TOLERANCE`] `x max(1, max |ref|)` of
//!   `Model::forward`'s;
//! - the filled positions of every layer's key / value buffer equal the reference's cache;
//! - a step past `L` is an error naming the limit and `--static-cache`, not a panic, and the
//!   buffers stay usable after it;
//! - greedy decoding gives the reference's tokens, and speculative decoding on a static folder
//!   (static draft / verifier / feed on one set of buffers) gives them too; a folder with a static
//!   model.onnx beside dynamic speculative graphs (written before those had static forms) still
//!   runs.
//!
//! On tiny (also with a sliding window, and with every bias), tiny-moe and SmolLM2-135M-Instruct.

use export::check::TOLERANCE;
use export::folder::{ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use ndarray::{ArrayView2, Axis};
use onnx_runner::decode;
use onnx_runner::ep::{Ep, EpConfig};
use onnx_runner::greedy::OnnxModel;
use onnx_runner::manifest::ExportDir;
use onnx_runner::speculation::OnnxSpeculation;
use reference::Model;
use reference::base::generate::{GenerateOptions, greedy};
use reference::decode::drafting::DraftingRequest;
use reference::decode::mode::DecodeRequest;
use reference::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use reference::io::builtin;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// Export `graphs` of `model` with a static model.onnx of `l_max` positions.
fn export_static(
    model: &Model,
    weights: &M2r2Weights,
    l_max: usize,
    graphs: &[GraphKind],
    dir: &Path,
) -> ExportDir {
    let request = ExportRequest {
        model,
        tokenizer: None,
        m2r2: weights,
        options: ExportOptions {
            model_name: "static".into(),
            opset: 17,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate: weights.config.draft_gate,
            static_cache: Some(l_max),
            merge_adapters: false,
        },
        graphs: graphs.to_vec(),
        external_data: false,
    };
    export(&request, dir, &mut |_| {}).expect("the static export succeeds");
    ExportDir::open(dir).expect("the export folder opens")
}

/// `max |a - b|` and whether it is within the tolerance of `b`'s scale.
fn within(what: &str, a: ArrayView2<f32>, b: ArrayView2<f32>) -> bool {
    assert_eq!(a.shape(), b.shape(), "{what}");
    let diff = a
        .iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let ok = diff <= TOLERANCE * scale;
    let verdict = if ok { "OK" } else { "NOT OK" };
    eprintln!("{verdict:<6} {what}: max |ORT - reference| = {diff:.2e} (max |ref| {scale:.1})");
    ok
}

/// Prefill `prompt`, then `steps` greedy steps, on the static model.onnx and the reference; then
/// the buffers' filled positions against the reference cache.
fn check_steps(name: &str, model: &Model, onnx: &mut OnnxModel, prompt: &[u32], steps: usize) {
    let l_max = onnx.static_l_max().expect("a static export");
    let mut cache = model.new_cache(l_max).unwrap();
    let mut all_ok = true;
    let mut feed = prompt.to_vec();
    for step in 0..=steps {
        let pos = cache.len();
        let want = model.forward(&feed, &mut cache).unwrap().logits;
        let got = onnx.forward(&feed).unwrap();
        all_ok &= within(
            &format!(
                "{name}: logits at positions {pos}..{} (step {step})",
                cache.len()
            ),
            got.view(),
            want.view(),
        );
        let last = want.index_axis(Axis(0), want.nrows() - 1);
        let next = last
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0;
        feed = vec![next as u32];
    }
    let len = cache.len();
    assert_eq!(onnx.len(), len);
    let kv = onnx.kv().unwrap();
    let c = &model.config;
    for l in 0..c.num_hidden_layers {
        let (k, v) = kv.layer(l);
        let (rk, rv) = cache.layer(l, len);
        for (what, got, want) in [("key", k, rk), ("value", v, rv)] {
            assert_eq!(got.shape(), [1, c.num_key_value_heads, len, c.head_dim]);
            // [1, Hkv, S, Dh] -> [S, Hkv*Dh], the reference's layout
            let rows = got
                .index_axis(Axis(0), 0)
                .permuted_axes([1, 0, 2])
                .as_standard_layout()
                .into_shape_with_order((len, c.num_key_value_heads * c.head_dim))
                .unwrap()
                .to_owned();
            all_ok &= within(
                &format!("{name}: layer {l} {what} buffer, positions 0..{len}"),
                rows.view(),
                want,
            );
        }
    }
    assert!(
        all_ok,
        "{name}: the static export differs from the reference"
    );
}

/// Fill the buffers to `L`, then one step more: a clear error, and the cache still usable.
fn check_full(name: &str, onnx: &mut OnnxModel) {
    let l_max = onnx.static_l_max().unwrap();
    onnx.reset();
    let fill: Vec<u32> = (0..l_max as u32).map(|i| i % 7 + 1).collect();
    onnx.forward(&fill).unwrap();
    let err = onnx.forward(&[1]).unwrap_err().to_string();
    for want in [
        format!("static cache holds {l_max} positions"),
        format!("needs {}", l_max + 1),
        "--static-cache".into(),
        "model.onnx".into(),
    ] {
        assert!(err.contains(&want), "{name}: {err}");
    }
    assert_eq!(onnx.len(), l_max, "{name}: a refused step changes nothing");
    onnx.reset();
    let over = vec![1u32; l_max + 1];
    assert!(onnx.forward(&over).is_err(), "{name}: a prefill past L");
    onnx.reset();
    onnx.forward(&[1, 2]).expect("usable after the refusal");
}

fn tiny_case(name: &str, model: &Model, weights: &M2r2Weights, l_max: usize) {
    tiny_case_on(name, model, weights, l_max, &EpConfig::cpu());
}

fn tiny_case_on(name: &str, model: &Model, weights: &M2r2Weights, l_max: usize, ep: &EpConfig) {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_static(model, weights, l_max, &[GraphKind::Model], dir.path());
    let mut onnx = OnnxModel::load(&exported, ep).unwrap();
    assert_eq!(onnx.session().ep_used(), ep.ep, "{name}: no fallback");
    check_steps(name, model, &mut onnx, &[3, 1, 4, 1, 5, 9, 2, 6], 6);
    // the same folder again from an empty cache: the buffers are reused, stale rows hidden
    onnx.reset();
    check_steps(&format!("{name} (reused)"), model, &mut onnx, &[7, 7], 3);
    check_full(name, &mut onnx);
}

#[test]
fn tiny_static_export_equals_the_reference() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    tiny_case("tiny", &model, &weights, 24);
}

/// A sliding window shorter than the sequence: the runner's mask hides keys past it.
#[test]
fn tiny_with_a_sliding_window_equals_the_reference() {
    let tiny = builtin::builtin("tiny").unwrap();
    let mut config = tiny.config.clone();
    config.sliding_window = Some(4);
    let model = Model::new(config, tiny.weights.clone());
    let weights = M2r2Weights::builtin_for("tiny", &tiny.config).unwrap();
    tiny_case("tiny, sliding window 4", &model, &weights, 20);
}

/// Biases on q/k/v (Qwen2), o and the MLP (Llama `attention_bias`, `mlp_bias`): stored head-major
/// for q/k/v, added after the head sum for o.
#[test]
fn tiny_with_every_bias_equals_the_reference() {
    let mut config = builtin::tiny_config();
    config.qkv_bias = true;
    config.o_bias = true;
    config.mlp_bias = true;
    let model = builtin::random_model(config, 7).unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    tiny_case("tiny with biases", &model, &weights, 24);
}

#[test]
fn tiny_moe_static_export_equals_the_reference() {
    let model = builtin::builtin("tiny-moe").unwrap();
    let weights = M2r2Weights::builtin_for("tiny-moe", &model.config).unwrap();
    tiny_case("tiny-moe", &model, &weights, 24);
}

/// Greedy decoding over a static folder gives the reference's tokens, and speculative decoding on
/// the same folder (static draft / verifier / feed sharing one set of buffers) gives them too;
/// both refuse to run past `L` with the limit named. (Round-by-round equality with the reference's
/// speculative run, KV included, is `equivalence.rs`'s property test, static exports among its
/// draws.)
#[test]
fn static_folder_decodes_greedy_and_speculative_like_the_reference() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let exported = export_static(&model, &weights, 32, &GraphKind::ALL, dir.path());
    let prompt = [5, 4, 3, 2];
    let options = GenerateOptions {
        max_new_tokens: 16,
        stop_tokens: vec![],
        sampling: None,
    };
    let want = greedy(&model, &prompt, 16, &[]).unwrap();
    let mut onnx = OnnxModel::load(&exported, &EpConfig::cpu()).unwrap();
    let got = onnx.generate(&prompt, &options, &mut |_, _| {}).unwrap();
    assert_eq!(got.tokens, want);
    let spec_options = |max_new_tokens| SpeculativeOptions {
        max_new_tokens,
        stop_tokens: vec![],
        draft_length: DraftLength::Fixed(3),
        sampling: None,
    };
    let mut spec = OnnxSpeculation::load(&exported, &EpConfig::cpu(), None).unwrap();
    let out = speculative_generate(&mut spec, &prompt, &spec_options(16)).unwrap();
    assert_eq!(out.tokens, want);
    // generation past L is refused with the same message, not a panic
    let long = GenerateOptions {
        max_new_tokens: 40,
        ..options
    };
    let err = onnx.generate(&prompt, &long, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("--static-cache"), "{err}");
    spec.reset();
    let err = speculative_generate(&mut spec, &prompt, &spec_options(40))
        .unwrap_err()
        .to_string();
    for want in ["static cache holds 32 positions", "--static-cache", ".onnx"] {
        assert!(err.contains(want), "{err}");
    }
    // and the same session decodes again from the start
    spec.reset();
    let again = speculative_generate(&mut spec, &prompt, &spec_options(16)).unwrap();
    assert_eq!(again.tokens, want);
}

/// `decode` and `decode_tree` refuse, before any run, a budget the buffers may not hold: greedy
/// `prompt + max_new - 1` positions, speculation as many more as a round drafts (the chain's
/// length, the tree's nodes below the root); the budget just inside decodes.
#[test]
fn decode_refuses_a_budget_past_the_buffers_up_front() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let exported = export_static(&model, &weights, 32, &GraphKind::ALL, dir.path());
    let prompt = [5, 4, 3, 2];
    let request = |max_new_tokens| DecodeRequest {
        prompt: &prompt,
        max_new_tokens,
        stop_tokens: vec![],
        sampling: None,
    };
    let settings = |speculative, draft_len| {
        decode::settings(
            &exported,
            DraftingRequest {
                speculative,
                gate: None,
                threshold: None,
                draft_len,
                dynamic_draft: false,
            },
        )
        .unwrap()
    };
    let ep = EpConfig::cpu();
    let (greedy, chain) = (settings(false, None), settings(true, Some(3)));
    // 4 + 29 - 1 = 32 positions fit; 4 + 26 - 1 + 3 = 32 with three drafts a round
    for (settings, fits) in [(&greedy, 29), (&chain, 26)] {
        let run = decode::decode(&exported, &ep, settings, &request(fits), false).unwrap();
        assert_eq!(run.run.tokens.len(), fits);
        let err = decode::decode(&exported, &ep, settings, &request(fits + 1), false)
            .err()
            .unwrap()
            .to_string();
        let needle = format!("--max-new-tokens {} ", fits + 1);
        for want in [
            "static cache holds 32 positions",
            needle.as_str(),
            "needs 33",
            &format!("ask for at most {fits} new tokens"),
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
    }
    // a tree 2,1 has 4 nodes below its root: 4 + 25 - 1 + 4 = 32
    let widths = [2, 1];
    decode::decode_tree(&exported, &ep, &request(25), &widths, None, None).unwrap();
    let err = decode::decode_tree(&exported, &ep, &request(26), &widths, None, None)
        .err()
        .unwrap()
        .to_string();
    for want in [
        "verifier.onnx",
        "a token tree of 5 nodes",
        "need 33 positions",
        "(L = 32)",
        "1 more than the static KV buffers hold",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

/// A folder written before the speculative graphs had static forms (a static model.onnx beside
/// dynamic draft / verifier / feed, its manifest listing `model` alone) still decodes
/// speculatively, on growing caches; a manifest that makes only some of the three static is
/// refused by name.
#[test]
fn static_model_beside_dynamic_speculative_graphs_still_runs() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mixed = dir.path().join("mixed");
    export_static(&model, &weights, 32, &[GraphKind::Model], &mixed);
    let dynamic = dir.path().join("dynamic");
    let request = ExportRequest {
        model: &model,
        tokenizer: None,
        m2r2: &weights,
        options: ExportOptions {
            model_name: "static".into(),
            opset: 17,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate: weights.config.draft_gate,
            static_cache: None,
            merge_adapters: false,
        },
        graphs: vec![GraphKind::Draft, GraphKind::Verifier, GraphKind::Feed],
        external_data: false,
    };
    export(&request, &dynamic, &mut |_| {}).unwrap();
    let manifest_path = mixed.join(export::folder::MANIFEST_FILE);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    for kind in [GraphKind::Draft, GraphKind::Verifier, GraphKind::Feed] {
        std::fs::copy(dynamic.join(kind.file_name()), mixed.join(kind.file_name())).unwrap();
        manifest["graphs"][kind.name()] = serde_json::json!(kind.file_name());
    }
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let exported = ExportDir::open(&mixed).unwrap();
    let prompt = [5, 4, 3, 2];
    let want = greedy(&model, &prompt, 12, &[]).unwrap();
    let mut spec = OnnxSpeculation::load(&exported, &EpConfig::cpu(), None).unwrap();
    let options = SpeculativeOptions {
        max_new_tokens: 12,
        stop_tokens: vec![],
        draft_length: DraftLength::Fixed(2),
        sampling: None,
    };
    assert_eq!(
        speculative_generate(&mut spec, &prompt, &options)
            .unwrap()
            .tokens,
        want
    );

    manifest["static_cache"]["graphs"] = serde_json::json!(["model", "draft"]);
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let err = ExportDir::open(&mixed).unwrap_err().to_string();
    for want in ["`draft`", "`verifier`", "all static or all dynamic"] {
        assert!(err.contains(want), "{err}");
    }
}

/// The same checks on ONNX Runtime's CUDA provider: the buffers in GPU memory from the session's
/// allocator, zeroed by a copy, written in place (docs/GPU.md runs it with scripts/gpu/).
/// CUDA graphs off here (the next test turns them on).
#[test]
#[ignore = "needs an NVIDIA GPU and ORT_DYLIB_PATH at an onnxruntime-gpu library (docs/GPU.md)"]
fn ort_cuda_static_export_equals_the_reference() {
    let ep = EpConfig {
        cuda_graph: Some(false),
        ..EpConfig::new(Ep::Cuda)
    };
    for name in ["tiny", "tiny-moe"] {
        let model = builtin::builtin(name).unwrap();
        let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
        tiny_case_on(&format!("{name} on CUDA"), &model, &weights, 24, &ep);
    }
    let mut config = builtin::tiny_config();
    config.sliding_window = Some(4);
    config.qkv_bias = true;
    let model = builtin::random_model(config, 7).unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    tiny_case_on("tiny, window 4, biases, on CUDA", &model, &weights, 20, &ep);
}

/// The decode step as a CUDA graph (`--cuda-graph on`): the same checks against the reference
/// (every one-row step runs with `gpu_graph_id` 1 on the persistent device buffers, the prefills
/// with -1), then each step's logits and the greedy tokens equal those with graphs off.
/// `ORT_LOG=info` makes ONNX Runtime log its capture and replays (scripts/gpu/device.sh counts
/// them).
#[test]
#[ignore = "needs an NVIDIA GPU and ORT_DYLIB_PATH at an onnxruntime-gpu library (docs/GPU.md)"]
fn ort_cuda_graph_static_export_equals_the_reference_and_graphs_off() {
    let with = |cuda_graph| EpConfig {
        cuda_graph: Some(cuda_graph),
        ..EpConfig::new(Ep::Cuda)
    };
    let mut config = builtin::tiny_config();
    config.sliding_window = Some(4);
    config.qkv_bias = true;
    let windowed = builtin::random_model(config, 7).unwrap();
    let cases = [
        ("tiny", builtin::builtin("tiny").unwrap()),
        ("tiny-moe", builtin::builtin("tiny-moe").unwrap()),
        ("tiny, window 4, biases", windowed),
    ];
    for (name, model) in &cases {
        let weights_name = if *name == "tiny-moe" {
            "tiny-moe"
        } else {
            "tiny"
        };
        let weights = M2r2Weights::builtin_for(weights_name, &model.config).unwrap();
        let name = format!("{name} on CUDA, graph");
        tiny_case_on(&name, model, &weights, 20, &with(true));

        let dir = tempfile::tempdir().unwrap();
        let exported = export_static(model, &weights, 20, &[GraphKind::Model], dir.path());
        let mut on = OnnxModel::load(&exported, &with(true)).unwrap();
        let mut off = OnnxModel::load(&exported, &with(false)).unwrap();
        assert!(off.cuda_graph_runs().is_none(), "{name}: off means off");
        let mut all_ok = true;
        for round in 0..2 {
            // a second round from an empty cache replays the graph captured in the first
            on.reset();
            off.reset();
            let mut feed = vec![3, 1, 4, 1];
            for step in 0..8 {
                let got = on.forward(&feed).unwrap();
                let want = off.forward(&feed).unwrap();
                all_ok &= within(
                    &format!("{name}: logits graph on = off (round {round}, step {step})"),
                    got.view(),
                    want.view(),
                );
                let last = want.index_axis(Axis(0), want.nrows() - 1);
                let next = last
                    .iter()
                    .enumerate()
                    .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
                    .0;
                feed = vec![next as u32];
            }
        }
        assert!(all_ok, "{name}: graphs on differ from graphs off");
        let runs = on.cuda_graph_runs().expect("graphs on");
        eprintln!(
            "OK     {name}: {} decode steps with gpu_graph_id 1, {} uncaptured prefills",
            runs.graph, runs.uncaptured
        );
        assert_eq!((runs.graph, runs.uncaptured), (14, 2), "{name}");
        let options = GenerateOptions {
            max_new_tokens: 12,
            stop_tokens: vec![],
            sampling: None,
        };
        let prompt = [5, 4, 3, 2];
        let want = greedy(model, &prompt, 12, &[]).unwrap();
        let got_on = on.generate(&prompt, &options, &mut |_, _| {}).unwrap();
        let got_off = off.generate(&prompt, &options, &mut |_, _| {}).unwrap();
        assert_eq!(
            got_off.tokens, want,
            "{name}: graphs off against the reference"
        );
        assert_eq!(
            got_on.tokens, want,
            "{name}: graphs on against the reference"
        );
        eprintln!("OK     {name}: greedy tokens graph on = off = reference");
    }
}

/// Speculative decoding on a static export on CUDA with CUDA graphs (the default there): every
/// draft row, fed row and verify chunk of `m` rows is a step binding captured as a graph of its
/// own (`gpu_graph_id` = rows), the prefill is not; the tokens equal the reference's greedy ones
/// and the rounds (drafts, accepted counts) equal those with graphs off, for fixed and
/// ARLA-dynamic drafts, twice from an empty cache (the second replays).
#[test]
#[ignore = "needs an NVIDIA GPU and ORT_DYLIB_PATH at an onnxruntime-gpu library (docs/GPU.md)"]
fn ort_cuda_graph_speculative_static_export_equals_graphs_off() {
    let with = |cuda_graph| EpConfig {
        cuda_graph: Some(cuda_graph),
        ..EpConfig::new(Ep::Cuda)
    };
    for name in ["tiny", "tiny-moe"] {
        let model = builtin::builtin(name).unwrap();
        let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let exported = export_static(&model, &weights, 48, &GraphKind::ALL, dir.path());
        let prompt = [5, 4, 3, 2];
        let want = greedy(&model, &prompt, 16, &[]).unwrap();
        let drafts = [
            (DraftLength::Fixed(3), None),
            (
                DraftLength::Dynamic {
                    max: 4,
                    gate: GateKind::Arla,
                    threshold: 0.5,
                },
                Some(GateKind::Arla),
            ),
        ];
        for (draft, gate) in drafts {
            let options = SpeculativeOptions {
                max_new_tokens: 16,
                stop_tokens: vec![],
                draft_length: draft.clone(),
                sampling: None,
            };
            let mut on = OnnxSpeculation::load(&exported, &with(true), gate).unwrap();
            let mut off = OnnxSpeculation::load(&exported, &with(false), gate).unwrap();
            assert!(off.cuda_graph_runs().is_none(), "{name}: off means off");
            let want_run = speculative_generate(&mut off, &prompt, &options).unwrap();
            assert_eq!(want_run.tokens, want, "{name} {draft:?}: graphs off");
            for round in 0..2 {
                on.reset();
                let got = speculative_generate(&mut on, &prompt, &options).unwrap();
                assert_eq!(got.tokens, want, "{name} {draft:?} round {round}");
                let shape = |r: &reference::decode::speculative::Round| {
                    (r.start, r.drafted.clone(), r.accepted, r.base_token)
                };
                let got_rounds: Vec<_> = got.rounds.iter().map(shape).collect();
                let want_rounds: Vec<_> = want_run.rounds.iter().map(shape).collect();
                assert_eq!(got_rounds, want_rounds, "{name} {draft:?} round {round}");
            }
            let runs = on.cuda_graph_runs().expect("graphs on");
            eprintln!(
                "OK     {name} {draft:?}: {} bound steps with a gpu_graph_id, {} uncaptured \
                 prefill runs; tokens and rounds graph on = off",
                runs.graph, runs.uncaptured
            );
            assert!(runs.graph > 0 && runs.uncaptured == 4, "{name}: {runs:?}");
        }
    }
}

/// SmolLM2-135M-Instruct (`m2r2 fetch smollm2`): prefill and decode steps, buffers, the full
/// buffer.
#[test]
fn smollm2_static_export_equals_the_reference() {
    let loaded =
        reference::io::load::load_model("smollm2").expect("run `m2r2 fetch smollm2` first");
    let model = &loaded.model;
    let weights = M2r2Weights::builtin_for("smollm2", &model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let exported = export_static(model, &weights, 40, &[GraphKind::Model], dir.path());
    let mut onnx = OnnxModel::load(&exported, &EpConfig::cpu()).unwrap();
    let prompt = loaded
        .tokenizer()
        .unwrap()
        .encode("The capital of France is", true)
        .unwrap();
    check_steps("smollm2", model, &mut onnx, &prompt, 6);
    check_full("smollm2", &mut onnx);
}
