//! Token trees on ONNX Runtime's CPU provider against the reference (the oracle): the reference's
//! tree loop (`reference::decode::tree_speculation`) runs on an export's graphs ([`OnnxSpeculation`]
//! as a `TreeBackend`), dynamic (`tree_mask` input, growing caches) and static (scratch slots of
//! the fixed buffers; also with `--merge-adapters`, the draft's stacked streams), and on the
//! reference's own tree backend.
//!
//! - Round by round the two draft the same tree tokens and accept the same node, and both emit
//!   greedy decoding's tokens;
//! - after the run, the filled positions of every layer's cache (the accepted paths moved into
//!   place, the rest dropped) are within the runner's tolerance of the reference's cache;
//! - a tree the static buffers cannot hold is refused with the limits named.
//!
//! On tiny (plain, bridged at each draft gate, with a sliding window), tiny-moe and
//! SmolLM2-135M-Instruct with its shipped weights (pruned draft head, bridge).

use export::check::TOLERANCE;
use export::folder::{ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use ndarray::ArrayView2;
use onnx_runner::ep::EpConfig;
use onnx_runner::manifest::ExportDir;
use onnx_runner::speculation::OnnxSpeculation;
use reference::Model;
use reference::base::generate::greedy;
use reference::base::sampling::SamplingParams;
use reference::base::tree::TokenTree;
use reference::decode::tree_speculation::{tree_speculate, tree_speculative_generate};
use reference::io::builtin;
use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// Export every graph of `model`, split at `draft_gate`, static with `l_max` positions
/// (`static_cache: None`: today's dynamic export).
fn export_all(
    model: &Model,
    weights: &M2r2Weights,
    draft_gate: usize,
    static_cache: Option<usize>,
    dir: &Path,
) -> ExportDir {
    export_with(model, weights, draft_gate, static_cache, false, dir)
}

/// [`export_all`], with `merge_adapters` (static only: the draft's stacked streams).
fn export_with(
    model: &Model,
    weights: &M2r2Weights,
    draft_gate: usize,
    static_cache: Option<usize>,
    merge_adapters: bool,
    dir: &Path,
) -> ExportDir {
    let request = ExportRequest {
        model,
        tokenizer: None,
        m2r2: weights,
        options: ExportOptions {
            model_name: "trees".into(),
            opset: 17,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate,
            static_cache,
            merge_adapters,
        },
        graphs: GraphKind::ALL.to_vec(),
        external_data: false,
    };
    export(&request, dir, &mut |_| {}).expect("the export succeeds");
    ExportDir::open(dir).expect("the export folder opens")
}

/// `max |a - b|` within the runner's tolerance of `b`'s scale.
fn within(a: ArrayView2<f32>, b: ArrayView2<f32>) -> bool {
    assert_eq!(a.shape(), b.shape());
    let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    diff <= TOLERANCE * scale
}

/// Decode `prompt` with each tree on the export and on the reference: the same rounds, greedy's
/// tokens, and the reference's cache in the buffers (ONNX Runtime's CPU provider).
fn check_trees(
    what: &str,
    model: &Model,
    weights: &M2r2Weights,
    draft_gate: usize,
    prompt: &[u32],
    new_tokens: usize,
    trees: &[&str],
) {
    check_trees_with(
        what,
        &EpConfig::cpu(),
        model,
        weights,
        draft_gate,
        prompt,
        new_tokens,
        trees,
    );
}

/// [`check_trees`] on the execution provider `ep`.
#[allow(clippy::too_many_arguments)]
fn check_trees_with(
    what: &str,
    ep: &EpConfig,
    model: &Model,
    weights: &M2r2Weights,
    draft_gate: usize,
    prompt: &[u32],
    new_tokens: usize,
    trees: &[&str],
) {
    let l_max = prompt.len() + new_tokens + 16;
    // merged adapters need dense layers below the gate (refused otherwise: export's tests)
    let dense = model
        .weights
        .layers
        .iter()
        .all(|l| matches!(l.ffn, reference::base::weights::FeedForward::Dense(_)));
    let exports = [(None, false), (Some(l_max), false), (Some(l_max), true)];
    for (static_cache, merged) in exports.into_iter().filter(|&(_, m)| dense || !m) {
        let dir = tempfile::tempdir().unwrap();
        let exported = export_with(model, weights, draft_gate, static_cache, merged, dir.path());
        let what = match (static_cache, merged) {
            (None, _) => format!("{what}, dynamic"),
            (Some(_), false) => format!("{what}, static"),
            (Some(_), true) => format!("{what}, static, merged adapters"),
        };
        check_trees_on(
            &what, ep, model, weights, draft_gate, &exported, prompt, new_tokens, trees,
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn check_trees_on(
    what: &str,
    ep: &EpConfig,
    model: &Model,
    weights: &M2r2Weights,
    draft_gate: usize,
    exported: &ExportDir,
    prompt: &[u32],
    new_tokens: usize,
    trees: &[&str],
) {
    let mut onnx = OnnxSpeculation::load(exported, ep, None).unwrap();
    let want = greedy(model, prompt, new_tokens, &[]).unwrap();
    let m2r2 = M2r2::new(model, weights);
    for spec in trees {
        let what = format!("{what}, tree {spec}");
        let tree = TokenTree::parse(spec).unwrap();
        let (reference, cache) =
            tree_speculative_generate(m2r2, draft_gate, &tree, prompt, new_tokens, &[], None)
                .unwrap();
        onnx.reset();
        let got = tree_speculate(&mut onnx, &tree, prompt, new_tokens, &[], None)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(reference.tokens, want, "{what}: the reference is greedy");
        assert_eq!(got.tokens, want, "{what}: ONNX Runtime is greedy");
        assert_eq!(got.rounds, reference.rounds, "{what}: the rounds differ");
        // the buffers hold the reference's cache: the accepted paths moved into place
        let (lower, upper) = onnx.kv().unwrap();
        let len = cache.len();
        assert_eq!((lower.len(), upper.len()), (len, len), "{what}");
        for store in [&lower, &upper] {
            for layer in store.layers() {
                let (k, v) = store.layer(layer);
                let (rk, rv) = cache.layer(layer, len);
                // [1, Hkv, S, Dh] -> [S, Hkv * Dh], the reference's layout
                let kv = |x: &ndarray::Array4<f32>| {
                    let x = x.index_axis(ndarray::Axis(0), 0).permuted_axes([1, 0, 2]);
                    let (s, hkv, dh) = x.dim();
                    ndarray::Array2::from_shape_vec((s, hkv * dh), x.iter().copied().collect())
                        .unwrap()
                };
                assert!(
                    within(kv(k).view(), rk) && within(kv(v).view(), rv),
                    "{what}: layer {layer}'s buffers are not the reference's cache"
                );
            }
        }
        eprintln!(
            "OK     {what}: {} rounds as the reference's",
            got.rounds.len()
        );
    }
    if let Some(runs) = onnx.cuda_graph_runs() {
        // every step shape a CUDA graph of its own: only the prefills (draft and verifier
        // layers, once per tree) are uncaptured
        eprintln!(
            "OK     {what}: {} runs of captured step shapes, {} uncaptured",
            runs.graph, runs.uncaptured
        );
        assert!(runs.graph > 0, "{what}: no captured runs");
        assert_eq!(
            runs.uncaptured,
            2 * trees.len(),
            "{what}: only the prefills"
        );
    }
}

const TREES: [&str; 4] = ["2,1,1", "3,2,1", "4", "1,1,1"];

#[test]
fn tiny_trees_decode_like_the_reference() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    for gate in 1..=weights.config.num_gates() {
        check_trees(
            &format!("tiny gate {gate}"),
            &model,
            &weights,
            gate,
            &[5, 9, 14, 3],
            16,
            &TREES,
        );
    }
}

#[test]
fn bridged_tiny_trees_decode_like_the_reference() {
    let model = builtin::builtin("tiny").unwrap();
    for gate in 1..=2 {
        let bridge = BridgeConfig::new(gate, 4, BridgeSite::ALL.to_vec());
        let weights = M2r2Weights::builtin_for("tiny", &model.config)
            .unwrap()
            .with_bridge(&model.config, bridge, 3, 0.5)
            .unwrap();
        let what = format!("tiny bridged at gate {gate}");
        check_trees(&what, &model, &weights, gate, &[7, 2, 9, 4], 16, &TREES);
    }
}

#[test]
fn windowed_and_moe_trees_decode_like_the_reference() {
    let mut windowed = builtin::builtin("tiny").unwrap();
    windowed.config.sliding_window = Some(3);
    let weights = M2r2Weights::builtin_for("tiny", &windowed.config).unwrap();
    let gate = weights.config.draft_gate;
    check_trees(
        "tiny, window 3",
        &windowed,
        &weights,
        gate,
        &[1, 2, 3, 4, 5],
        12,
        &TREES,
    );
    let moe = builtin::builtin("tiny-moe").unwrap();
    let weights = M2r2Weights::builtin_for("tiny-moe", &moe.config).unwrap();
    let gate = weights.config.draft_gate;
    check_trees(
        "tiny-moe",
        &moe,
        &weights,
        gate,
        &[3, 1, 4, 1, 5],
        12,
        &TREES[..2],
    );
}

/// A tree the static buffers cannot hold after the prompt and the budget is refused with the
/// limits named, before any work; the session then decodes a tree that fits.
#[test]
fn oversized_trees_are_refused() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let gate = weights.config.draft_gate;
    let tree = TokenTree::parse("2,1").unwrap();
    let static_dir = tempfile::tempdir().unwrap();
    let exported = export_all(&model, &weights, gate, Some(12), static_dir.path());
    let mut onnx = OnnxSpeculation::load(&exported, &EpConfig::cpu(), None).unwrap();
    // 3 prompt tokens, 7 new ones and 4 nodes below the root: 3 + 6 + 4 = 13 positions
    let err = tree_speculate(&mut onnx, &tree, &[1, 2, 3], 7, &[], None)
        .unwrap_err()
        .to_string();
    for want in [
        "5 nodes",
        "need 13 positions",
        "(L = 12)",
        "--static-cache",
        "1 more than the static KV buffers hold",
    ] {
        assert!(err.contains(want), "{err}");
    }
    // one token fewer fills the buffers exactly
    onnx.reset();
    let got = tree_speculate(&mut onnx, &tree, &[1, 2, 3], 6, &[], None).unwrap();
    assert_eq!(got.tokens, greedy(&model, &[1, 2, 3], 6, &[]).unwrap());
}

/// SmolLM2-135M-Instruct with its shipped M2R2 weights (pruned draft head, bridge).
#[test]
fn smollm2_trees_decode_like_the_reference() {
    let loaded =
        reference::io::load::load_model("smollm2").expect("run `m2r2 fetch smollm2` first");
    let model = &loaded.model;
    let weights = M2r2Weights::builtin_for("smollm2", &model.config).unwrap();
    let prompt = loaded
        .tokenizer()
        .unwrap()
        .encode("The capital of France is", true)
        .unwrap();
    let gate = weights.config.draft_gate;
    check_trees(
        "smollm2",
        model,
        &weights,
        gate,
        &prompt,
        10,
        &["2,1,1", "3,1"],
    );
}

/// Sampling on a tree runs the same loop on both engines: with the same seed, ONNX Runtime's
/// draft and base distributions (within the tolerance of the reference's) draw the reference's
/// tokens, rounds and accepted nodes, on a dynamic and a static export. (The rule's losslessness
/// is the reference's chi-square test, `decode/tree_sampling.rs`.)
#[test]
fn sampled_trees_draw_the_references_tokens() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let gate = weights.config.draft_gate;
    let m2r2 = M2r2::new(&model, &weights);
    let prompt = [5u32, 9, 14, 3];
    for static_cache in [None, Some(48)] {
        let dir = tempfile::tempdir().unwrap();
        let exported = export_all(&model, &weights, gate, static_cache, dir.path());
        let mut onnx = OnnxSpeculation::load(&exported, &EpConfig::cpu(), None).unwrap();
        for (spec, seed) in [("2,1,1", 1), ("3,2", 2), ("2,2", 3)] {
            let tree = TokenTree::parse(spec).unwrap();
            let sampling = Some(SamplingParams {
                temperature: 1.2,
                top_k: None,
                top_p: Some(0.95),
                seed,
            });
            let (want, _) =
                tree_speculative_generate(m2r2, gate, &tree, &prompt, 16, &[], sampling.clone())
                    .unwrap();
            onnx.reset();
            let got = tree_speculate(&mut onnx, &tree, &prompt, 16, &[], sampling).unwrap();
            let what = format!("static {static_cache:?}, tree {spec}, seed {seed}");
            assert_eq!(got.tokens, want.tokens, "{what}");
            assert_eq!(got.rounds, want.rounds, "{what}");
        }
    }
}

/// The same trees on ONNX Runtime's CUDA provider (docs/GPU.md runs it with scripts/gpu/): dynamic
/// exports, and static ones with CUDA graphs on (their default there: every draft level and
/// verify chunk a captured shape of its own) and off.
#[test]
#[ignore = "needs an NVIDIA GPU and ORT_DYLIB_PATH at an onnxruntime-gpu library (docs/GPU.md)"]
fn ort_cuda_trees_decode_like_the_reference() {
    use onnx_runner::ep::Ep;
    let mut windowed = builtin::builtin("tiny").unwrap();
    windowed.config.sliding_window = Some(3);
    let cases = [
        ("tiny", builtin::builtin("tiny").unwrap(), "tiny"),
        ("tiny, window 3", windowed, "tiny"),
        (
            "tiny-moe",
            builtin::builtin("tiny-moe").unwrap(),
            "tiny-moe",
        ),
    ];
    for cuda_graph in [None, Some(false)] {
        let ep = EpConfig {
            cuda_graph,
            ..EpConfig::new(Ep::Cuda)
        };
        for (name, model, weights) in &cases {
            let weights = M2r2Weights::builtin_for(weights, &model.config).unwrap();
            let gate = weights.config.draft_gate;
            let what = format!("{name} on CUDA, graphs {cuda_graph:?}");
            check_trees_with(
                &what,
                &ep,
                model,
                &weights,
                gate,
                &[1, 2, 3, 4, 5],
                12,
                &TREES,
            );
        }
    }
}

/// A threshold between two of `scores` near their median, at the widest gap there, so that
/// scores from two engines (equal within the tolerance) fall on the same side of it.
fn threshold_between(mut scores: Vec<f32>) -> f32 {
    scores.sort_by(f32::total_cmp);
    let n = scores.len();
    assert!(n >= 4, "too few scores: {n}");
    let window = (n / 4)..(3 * n / 4).min(n - 1);
    let i = window
        .max_by(|&a, &b| {
            let gap = |i: usize| scores[i + 1] - scores[i];
            gap(a).total_cmp(&gap(b))
        })
        .expect("a window");
    (scores[i] + scores[i + 1]) / 2.0
}

/// Dynamic drafting per branch on the export's graphs: the reference's dynamic tree loop on
/// ONNX Runtime (its gate: ARLA's `exit_prob` output, or the confidence of the draft logits)
/// grows the trees the reference grows, round by round (the same trees, tokens, accepted nodes,
/// and scores within the tolerance), on dynamic, static and merged-adapter static exports.
fn check_dynamic_trees(
    what: &str,
    model: &Model,
    weights: &M2r2Weights,
    prompt: &[u32],
    new_tokens: usize,
    shape: &str,
) {
    use reference::decode::tree_draft_verify::ReferenceTreeSpeculation;
    use reference::decode::tree_speculation::tree_speculate_dynamic;
    use reference::m2r2::exit_gate::GateKind;
    let gate = weights.config.draft_gate;
    let m2r2 = M2r2::new(model, weights);
    let shape = TokenTree::parse(shape).unwrap();
    let want = greedy(model, prompt, new_tokens, &[]).unwrap();
    let l_max = prompt.len() + new_tokens + shape.nodes() + 4;
    let kinds = [GateKind::Confidence, GateKind::Arla];
    // the reference's decode per gate, at a threshold that prunes some rounds
    let mut references = Vec::new();
    for kind in kinds
        .into_iter()
        .filter(|k| *k != GateKind::Arla || weights.arla.is_some())
    {
        let reference_run = |threshold: f32| {
            let capacity = prompt.len() + new_tokens + shape.nodes();
            let mut backend = ReferenceTreeSpeculation::new(m2r2, gate, capacity)
                .unwrap()
                .with_gate(Some(kind));
            tree_speculate_dynamic(
                &mut backend,
                &shape,
                threshold,
                prompt,
                new_tokens,
                &[],
                None,
            )
            .unwrap()
        };
        let pilot = reference_run(-1.0);
        let threshold =
            threshold_between(pilot.rounds.iter().flat_map(|r| r.scores.clone()).collect());
        let reference = reference_run(threshold);
        assert_eq!(reference.tokens, want, "{what}: the reference is greedy");
        let pruned = reference
            .rounds
            .iter()
            .filter(|r| r.tree.nodes() < shape.nodes())
            .count();
        assert!(pruned > 0, "{what} {kind:?}: no round was pruned");
        references.push((kind, threshold, reference));
    }
    // each export written once (three SmolLM2 exports, not three per gate), every gate run on it
    for (static_cache, merged) in [(None, false), (Some(l_max), false), (Some(l_max), true)] {
        let dir = tempfile::tempdir().unwrap();
        let exported = export_with(model, weights, gate, static_cache, merged, dir.path());
        for (kind, threshold, reference) in &references {
            let (kind, threshold) = (*kind, *threshold);
            let what =
                format!("{what}, {kind:?} {threshold}, static {static_cache:?} merged {merged}");
            let mut onnx = OnnxSpeculation::load(&exported, &EpConfig::cpu(), Some(kind)).unwrap();
            let got =
                tree_speculate_dynamic(&mut onnx, &shape, threshold, prompt, new_tokens, &[], None)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got.tokens, want, "{what}: ONNX Runtime is greedy");
            assert_eq!(got.rounds.len(), reference.rounds.len(), "{what}");
            for (g, r) in got.rounds.iter().zip(&reference.rounds) {
                assert_eq!(
                    (&g.tree, &g.tokens, g.node, g.base_token),
                    (&r.tree, &r.tokens, r.node, r.base_token),
                    "{what}"
                );
                assert_eq!(g.scores.len(), r.scores.len(), "{what}");
                for (a, b) in g.scores.iter().zip(&r.scores) {
                    assert!((a - b).abs() <= 1e-4, "{what}: score {a} against {b}");
                }
            }
        }
    }
}

#[test]
fn dynamic_trees_grow_like_the_reference() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    check_dynamic_trees("tiny", &model, &weights, &[5, 9, 14, 3], 24, "2,2,1");
    let bridge = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
    let bridged = weights.with_bridge(&model.config, bridge, 3, 0.5).unwrap();
    check_dynamic_trees("tiny bridged", &model, &bridged, &[7, 2, 9, 4], 24, "2,1,1");
}

/// SmolLM2-135M-Instruct with its shipped weights (ARLA, bridge, pruned draft head).
#[test]
fn smollm2_dynamic_trees_grow_like_the_reference() {
    let loaded =
        reference::io::load::load_model("smollm2").expect("run `m2r2 fetch smollm2` first");
    let weights = M2r2Weights::builtin_for("smollm2", &loaded.model.config).unwrap();
    let prompt = loaded
        .tokenizer()
        .unwrap()
        .encode("The capital of France is", true)
        .unwrap();
    check_dynamic_trees("smollm2", &loaded.model, &weights, &prompt, 16, "2,1,1");
}

/// An export written before the speculative graphs took `tree_mask` refuses token trees by name
/// (export the folder again) instead of running them with the wrong masks. No such export can be
/// written now, so one is simulated: the input is renamed in draft, verifier and feed.onnx and
/// given a default value (an initializer of the same name), as if the graphs computed their own
/// masks; the runner then sees no `tree_mask` and must refuse the tree before drafting it.
#[test]
fn exports_without_tree_mask_refuse_trees_by_name() {
    use export::proto::TensorProto;
    use export::write::{read_graph, write_graph};
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let gate = weights.config.draft_gate;
    let dir = tempfile::tempdir().unwrap();
    let exported = export_all(&model, &weights, gate, None, dir.path());
    let old = "visibility_computed_inside";
    for file in ["draft.onnx", "verifier.onnx", "feed.onnx"] {
        let path = dir.path().join(file);
        let mut proto = read_graph(&path).unwrap();
        let graph = proto.graph.as_mut().unwrap();
        for input in &mut graph.input {
            if input.name.as_deref() == Some("tree_mask") {
                input.name = Some(old.into());
            }
        }
        for node in &mut graph.node {
            for input in &mut node.input {
                if input == "tree_mask" {
                    *input = old.into();
                }
            }
        }
        graph.initializer.push(TensorProto {
            name: Some(old.into()),
            dims: vec![1, 1],
            data_type: Some(7), // int64
            int64_data: vec![1],
            ..Default::default()
        });
        write_graph(proto, &path, false).unwrap();
    }
    let mut onnx = OnnxSpeculation::load(&exported, &EpConfig::cpu(), None).unwrap();
    let tree = TokenTree::parse("2,1").unwrap();
    let err = tree_speculate(&mut onnx, &tree, &[5, 9, 14, 3], 8, &[], None)
        .unwrap_err()
        .to_string();
    for want in [
        "token trees need the graph's `tree_mask` input",
        "export the folder again",
        ".onnx",
    ] {
        assert!(err.contains(want), "{err}");
    }
}
