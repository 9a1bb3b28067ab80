//! Whole graphs against the reference through [`export::check::check_folder`]: logits, draft
//! logits, exit_prob, hidden_states and every present K/V of model.onnx, draft.onnx,
//! verifier.onnx and feed.onnx, fed in two chunks (the second reads the first one's cache), and
//! draft.onnx -> verifier.onnx and feed.onnx -> verifier.onnx against model.onnx. On random small dense and MoE configs (proptest), on
//! SmolLM2-135M (exported once), and in the f16 flavour against the reference with f16-rounded
//! weights. Tolerance: [`export::check::TOLERANCE`] (1e-4 x max(1, max |ref|), f32 on the CPU).

mod common;

use export::builder::WeightsDtype;
use export::check::{Comparison, check_folder};
use export::folder::{ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use proptest::prelude::*;
use reference::base::model::Model;
use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
use reference::m2r2::config::M2r2Config;
use reference::m2r2::draft_head::DraftHead;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

fn export_all(
    model: &Model,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    dtype: WeightsDtype,
    tokenizer: Option<&reference::io::tokenizer::Tokenizer>,
    out: &Path,
) {
    let request = ExportRequest {
        model,
        tokenizer,
        m2r2,
        options: ExportOptions {
            model_name: "test".into(),
            opset: 17,
            weights_dtype: dtype,
            draft_gate,
            static_cache: None,
            merge_adapters: false,
        },
        graphs: GraphKind::ALL.to_vec(),
        external_data: false,
    };
    export(&request, out, &mut |_| {}).expect("export");
}

fn assert_all_ok(rows: &[Comparison]) {
    for r in rows {
        println!(
            "{:<28} {:<40} {:.3e} (max |ref| {:.3}) {}",
            r.graph,
            r.tensor,
            r.max_abs_diff,
            r.max_abs_ref,
            if r.ok() { "OK" } else { "NOT OK" }
        );
    }
    assert!(
        rows.iter().all(Comparison::ok),
        "some tensors differ from the reference"
    );
    let graphs: std::collections::HashSet<&str> = rows.iter().map(|r| r.graph.as_str()).collect();
    assert_eq!(
        graphs.len(),
        6,
        "every graph and both chains were compared: {graphs:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Random small dense / MoE models (biases, sliding window, GQA from the small config), random
    /// M2R2 weights with or without a pruned draft head and a bridge, every draft gate, random tokens
    /// split into two chunks.
    #[test]
    fn random_models_match_reference(
        moe in any::<bool>(),
        layers in 3usize..=5,
        qkv_bias in any::<bool>(),
        window in prop::option::of(2usize..6),
        seed in 0u64..1000,
        gate_pick in 0usize..3,
        tokens in prop::collection::vec(0u32..40, 3..9),
        split_pick in 0usize..100,
        head in prop::option::of(prop::collection::btree_set(0u32..40, 1..20)),
        bridge in prop::option::of(prop::sample::select(vec![
            vec![BridgeSite::Entry],
            vec![BridgeSite::Gate],
            BridgeSite::ALL.to_vec(),
        ])),
    ) {
        let mut config = m2r2_tests::small_config(layers, moe, 40);
        config.qkv_bias = qkv_bias;
        config.sliding_window = window;
        let model = reference::io::builtin::random_model(config, seed).unwrap();
        let c = &model.config;
        let mut m2r2 = M2r2Weights::random(c, M2r2Config::default_for(c), seed + 1).unwrap();
        // A pruned draft head: draft_logits [1, T, K] against the reference's subset logits.
        m2r2.draft_head = head.map(|h| DraftHead::new(h.into_iter().collect(), 40, "test").unwrap());
        let draft_gate = 1 + gate_pick % m2r2.config.num_gates();
        // A bridge: draft.onnx reads bridge_states, gives exit_states; verifier.onnx final_states.
        if let Some(sites) = bridge {
            m2r2 = m2r2.with_bridge(c, BridgeConfig { gate: draft_gate, rank: 3, scales: [(BridgeSite::Gate, 0.5)].into_iter().filter(|(s, _)| sites.contains(s)).collect(), sites }, seed + 2, 0.5).unwrap();
        }
        let split = 1 + split_pick % (tokens.len() - 1);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("export");
        export_all(&model, &m2r2, draft_gate, WeightsDtype::F32, None, &out);
        let rows = check_folder(&out, &model, &m2r2, draft_gate, &GraphKind::ALL, &tokens, split).unwrap();
        assert_all_ok(&rows);
    }
}

/// Without ARLA weights (`--m2r2 none`): no exit_prob output, the rest still matches.
#[test]
fn zero_adapters_without_arla_match_reference() {
    let model = reference::io::builtin::builtin("tiny").unwrap();
    let m2r2 = M2r2Weights::zeros(&model.config);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export");
    export_all(&model, &m2r2, 2, WeightsDtype::F32, None, &out);
    let rows = check_folder(&out, &model, &m2r2, 2, &GraphKind::ALL, &[5, 6, 7, 8, 9], 2).unwrap();
    assert!(rows.iter().all(|r| !r.tensor.starts_with("exit_prob")));
    assert_all_ok(&rows);
}

/// f16 weights with casts: equal to the reference run on the f16-rounded weights (tiny with a
/// bridge, tiny-moe with a pruned draft head, whose `draft_head.weight` is f16 too).
#[test]
fn f16_flavour_matches_reference_with_rounded_weights() {
    for name in ["tiny", "tiny-moe"] {
        let (model, m2r2) = common::f16_case(name);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("export");
        export_all(&model, &m2r2, 1, WeightsDtype::F16, None, &out);
        let (model16, m2r2_16) = export::check::rounded_to_f16(&model, &m2r2);
        let rows = check_folder(
            &out,
            &model16,
            &m2r2_16,
            1,
            &GraphKind::ALL,
            &[1, 2, 3, 4, 5, 6],
            3,
        )
        .unwrap();
        assert_all_ok(&rows);
    }
}

/// SmolLM2-135M-Instruct (cached by `m2r2 fetch smollm2`), exported once, on a short probe.
#[test]
fn smollm2_matches_reference() {
    let loaded =
        reference::io::load::load_model("smollm2").expect("run `m2r2 fetch smollm2` first");
    let m2r2 = M2r2Weights::builtin_for("smollm2", &loaded.model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export");
    export_all(
        &loaded.model,
        &m2r2,
        1,
        WeightsDtype::F32,
        loaded.tokenizer.as_ref(),
        &out,
    );
    for file in [
        "genai_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "m2r2_export.json",
    ] {
        assert!(out.join(file).is_file(), "{file} written");
    }
    let tokens = export::check::probe_tokens(&loaded.model, loaded.tokenizer.as_ref()).unwrap();
    let rows = check_folder(
        &out,
        &loaded.model,
        &m2r2,
        1,
        &GraphKind::ALL,
        &tokens[..6],
        3,
    )
    .unwrap();
    assert_all_ok(&rows);
}

/// Dynamic batch and `attention_mask`: a batch of two sequences, the second left-padded (mask 0,
/// any position), gives each real row the logits of its sequence run alone in the reference.
#[test]
fn batch_with_left_padding_matches_each_sequence_alone() {
    use ndarray::{ArrayD, s};
    use onnx_runner::session::{Input, OnnxSession};
    let model = reference::io::builtin::builtin("tiny").unwrap();
    let m2r2 = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export");
    export_all(&model, &m2r2, 1, WeightsDtype::F32, None, &out);
    onnx_runner::runtime::init().unwrap();
    let mut session =
        OnnxSession::load(&out.join("model.onnx"), &onnx_runner::ep::EpConfig::cpu()).unwrap();
    let (a, b) = ([5u32, 6, 7, 8, 9], [10u32, 11, 12]);
    let ids = ArrayD::from_shape_vec(vec![2, 5], vec![5, 6, 7, 8, 9, 0, 0, 10, 11, 12]).unwrap();
    let mask = ArrayD::from_shape_vec(vec![2, 5], vec![1, 1, 1, 1, 1, 0, 0, 1, 1, 1]).unwrap();
    let pos = ArrayD::from_shape_vec(vec![2, 5], vec![0, 1, 2, 3, 4, 0, 0, 0, 1, 2]).unwrap();
    let c = &model.config;
    let empty = ArrayD::<f32>::zeros(vec![2, c.num_key_value_heads, 0, c.head_dim]);
    let names: Vec<(String, String)> = (0..c.num_hidden_layers)
        .map(export::graphs::past_names)
        .collect();
    let mut inputs = vec![
        ("input_ids", Input::I64(ids.view())),
        ("attention_mask", Input::I64(mask.view())),
        ("position_ids", Input::I64(pos.view())),
    ];
    for (k, v) in &names {
        inputs.push((k, Input::F32(empty.view())));
        inputs.push((v, Input::F32(empty.view())));
    }
    let outputs = session.run(&inputs).unwrap();
    let logits = outputs.get("logits").unwrap();
    assert!(
        logits.iter().all(|v| v.is_finite()),
        "padded rows stay finite"
    );
    let want_a = model.teacher_forced_logits(&a).unwrap().into_dyn();
    let want_b = model.teacher_forced_logits(&b).unwrap().into_dyn();
    let got_a = logits.slice(s![0, .., ..]).to_owned().into_dyn();
    let got_b = logits.slice(s![1, 2.., ..]).to_owned().into_dyn();
    let tol = |want: &ArrayD<f32>| {
        export::check::TOLERANCE * want.iter().fold(1.0f32, |m, v| m.max(v.abs()))
    };
    assert!(common::max_diff("sequence a", &got_a, &want_a) <= tol(&want_a));
    assert!(common::max_diff("sequence b (left-padded)", &got_b, &want_b) <= tol(&want_b));
}
