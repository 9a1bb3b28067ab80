//! ONNX Runtime decodes exactly like the reference (tier 3: the reference is the oracle).
//!
//! For random tiny dense and MoE models with random adapters and ARLA, with or without a random
//! pruned draft head (draft.onnx then outputs its `K` columns), exported with `m2r2-export`:
//! - greedy over model.onnx: every step's logits within [`LOGITS_TOL`] of the reference's
//!   teacher-forced logits, the same tokens, and the final KV cache within [`KV_TOL`];
//! - speculative over draft.onnx / verifier.onnx through the reference's own loop (dynamic exports
//!   and static ones, `--static-cache`, with fixed buffers written in place): the reference's
//!   greedy tokens, the same rounds (drafted tokens, accepted counts, base tokens; gate scores
//!   within [`LOGITS_TOL`]) as the reference's speculative run, and both KV stores within
//!   [`KV_TOL`] of the reference backend's cache.
//!
//! On ORT CPU in CI. The same checks on CUDA and TensorRT are `#[ignore]`d tests (they need an
//! NVIDIA GPU and an onnxruntime-gpu library):
//! `ORT_DYLIB_PATH=/path/to/onnxruntime-gpu/capi/libonnxruntime.so.1.31.1 cargo test --release -p m2r2-onnx-runner --test equivalence -- --ignored`

use export::folder::{ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use m2r2_tests::{DecodeProblem, DraftSettings};
use ndarray::{Array2, ArrayView2};
use onnx_runner::ep::{DimRanges, Ep, EpConfig, TensorRtOptions};
use onnx_runner::greedy::OnnxModel;
use onnx_runner::kv_store::KvStore;
use onnx_runner::manifest::{ExportDir, GraphKind as OnnxGraph};
use onnx_runner::speculation::OnnxSpeculation;
use proptest::prelude::*;
use reference::base::generate::{GenerateOptions, greedy};
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use reference::{KvCache, Model};
use std::path::Path;

/// f32 graphs on ONNX Runtime against the reference: different summation order only.
const LOGITS_TOL: f32 = 1e-4;
const KV_TOL: f32 = 1e-4;

/// One llm.c-style line per comparison, printed before the assertion (`--nocapture` shows them).
fn report(what: &str, diff: f32, tol: f32) {
    let verdict = if diff <= tol { "OK" } else { "NOT OK" };
    eprintln!("{verdict:<6} {what}: max |ORT - reference| = {diff:.2e} (tolerance {tol:.0e})");
}

fn max_abs_diff(a: ArrayView2<f32>, b: ArrayView2<f32>) -> f32 {
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Export every graph of `model` with `weights`, split at `draft_gate`.
pub fn export_all(
    model: &Model,
    weights: &M2r2Weights,
    draft_gate: usize,
    dir: &Path,
) -> ExportDir {
    export_graphs(model, weights, draft_gate, dir, &GraphKind::ALL, None)
}

/// Export `graphs` of `model` with `weights`, split at `draft_gate`; with `static_cache` `Some(L)`
/// every graph keeps its cache in fixed buffers of `L` positions (`export --static-cache`).
pub fn export_graphs(
    model: &Model,
    weights: &M2r2Weights,
    draft_gate: usize,
    dir: &Path,
    graphs: &[GraphKind],
    static_cache: Option<usize>,
) -> ExportDir {
    let request = ExportRequest {
        model,
        tokenizer: None,
        m2r2: weights,
        options: ExportOptions {
            model_name: "random".into(),
            opset: 17,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate,
            static_cache,
            merge_adapters: false,
        },
        graphs: graphs.to_vec(),
        external_data: false,
    };
    export(&request, dir, &mut |_| {}).expect("the export succeeds");
    ExportDir::open(dir).expect("the export folder opens")
}

/// Max |ORT - reference| over the first `len` positions of every layer of `store`.
///
/// # Shapes
/// - store: `[1, Hkv, S, Dh]` per layer; reference cache: `[S, Hkv*Dh]` per layer
fn kv_diff(store: &KvStore, cache: &KvCache, len: usize) -> f32 {
    let mut worst = 0.0f32;
    for layer in store.layers() {
        let (k, v) = store.layer(layer);
        let (rk, rv) = cache.layer(layer, len);
        assert_eq!(
            k.shape()[2],
            len,
            "layer {layer} holds {} positions",
            k.shape()[2]
        );
        for (ort, want) in [(k, rk), (v, rv)] {
            let (hkv, dh) = (ort.shape()[1], ort.shape()[3]);
            for s in 0..len {
                for h in 0..hkv {
                    for d in 0..dh {
                        worst = worst.max((ort[[0, h, s, d]] - want[[s, h * dh + d]]).abs());
                    }
                }
            }
        }
    }
    worst
}

/// A decoding problem, how it drafts, (CPU) whether the KV cache stays in host arrays instead of
/// ONNX Runtime values, whether the export has feed.onnx (without it the runner feeds
/// through draft.onnx, as for exports made before feed.onnx existed), and whether it is static
/// (`--static-cache`, fixed buffers with room for the run and `spare` more positions).
#[derive(Debug, Clone)]
struct Problem {
    base: DecodeProblem,
    drafting: DraftSettings,
    host_kv: bool,
    feed: bool,
    spare: Option<usize>,
}

fn problem_strategy() -> impl Strategy<Value = Problem> {
    (
        DecodeProblem::strategy(2..5, 40, 1..6, 1..12),
        DraftSettings::strategy(5, 40),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(0..4usize),
    )
        .prop_map(|(base, drafting, host_kv, feed, spare)| Problem {
            base,
            drafting,
            host_kv,
            feed,
            spare,
        })
}

impl Problem {
    fn check(&self, ep: &EpConfig) -> Result<(), TestCaseError> {
        let (base, mut weights) = self.base.setup(0x55);
        let draft_gate = self.drafting.apply(&base, &mut weights);
        let dir = tempfile::tempdir().unwrap();
        let graphs: Vec<GraphKind> = GraphKind::ALL
            .into_iter()
            .filter(|&k| self.feed || k != GraphKind::Feed)
            .collect();
        // a static buffer holds the prompt, the new tokens and the drafts past them
        let needed = self.base.prompt.len() + self.base.new_tokens + self.drafting.draft.max() + 1;
        let static_cache = self.spare.map(|spare| needed + spare);
        let exported = export_graphs(
            &base,
            &weights,
            draft_gate,
            dir.path(),
            &graphs,
            static_cache,
        );
        prop_assert_eq!(exported.has(OnnxGraph::Feed), self.feed);
        prop_assert_eq!(exported.static_l_max(OnnxGraph::Draft), static_cache);
        // TensorRT's profiles cover a static export's buffers too, as `m2r2 run` makes them
        let mut ep = ep.clone();
        if let (Some(l), Some(ranges)) = (static_cache, ep.tensorrt.ranges.take()) {
            ep.tensorrt.ranges = Some(ranges.with_buffer(l));
        }
        check_decoding(
            &base,
            &weights,
            &exported,
            &ep,
            &self.base.prompt,
            self.base.new_tokens,
            &self.drafting.draft,
        )
    }
}

/// Greedy and speculative on ONNX Runtime against the reference, for one prompt.
fn check_decoding(
    base: &Model,
    weights: &M2r2Weights,
    exported: &ExportDir,
    ep: &EpConfig,
    prompt: &[u32],
    new_tokens: usize,
    draft: &DraftLength,
) -> Result<(), TestCaseError> {
    let draft_gate = exported.manifest.draft_gate;
    let want = greedy(base, prompt, new_tokens, &[]).unwrap();

    // greedy over model.onnx: tokens, per-step logits, final KV
    let mut model = OnnxModel::load(exported, ep).unwrap();
    let options = GenerateOptions {
        max_new_tokens: new_tokens,
        stop_tokens: vec![],
        sampling: None,
    };
    let mut step_logits: Vec<Vec<f32>> = Vec::new();
    let got = model
        .generate(prompt, &options, &mut |_, logits| {
            step_logits.push(logits.to_vec())
        })
        .unwrap();
    prop_assert_eq!(&got.tokens, &want, "greedy tokens on ORT");
    let fed: Vec<u32> = prompt
        .iter()
        .chain(&want[..want.len() - 1])
        .copied()
        .collect();
    let teacher = base.teacher_forced_logits(&fed).unwrap(); // [P + n - 1, V]
    let rows = Array2::from_shape_fn((step_logits.len(), teacher.ncols()), |(i, v)| {
        step_logits[i][v]
    });
    let diff = max_abs_diff(
        rows.view(),
        teacher.slice(ndarray::s![prompt.len() - 1.., ..]),
    );
    report("greedy logits (model.onnx)", diff, LOGITS_TOL);
    prop_assert!(diff <= LOGITS_TOL, "greedy logits differ by {diff}");
    let mut cache = base.new_cache(fed.len()).unwrap();
    base.forward(&fed, &mut cache).unwrap();
    let diff = kv_diff(&model.kv().unwrap(), &cache, fed.len());
    report("present KV (model.onnx)", diff, KV_TOL);
    prop_assert!(diff <= KV_TOL, "present KV of model.onnx differs by {diff}");

    // speculative over draft.onnx / verifier.onnx, against the reference's speculative run
    let gate = match draft {
        DraftLength::Dynamic { gate, .. } => Some(*gate),
        DraftLength::Fixed(_) => None,
    };
    let options = SpeculativeOptions {
        max_new_tokens: new_tokens,
        stop_tokens: vec![],
        draft_length: draft.clone(),
        sampling: None,
    };
    let capacity = prompt.len() + new_tokens + draft.max() + 1;
    let mut reference =
        ReferenceSpeculation::new(M2r2::new(base, weights), draft_gate, gate, capacity).unwrap();
    let want_run = speculative_generate(&mut reference, prompt, &options).unwrap();
    let mut onnx = OnnxSpeculation::load(exported, ep, gate).unwrap();
    prop_assert_eq!(onnx.feed_session().is_some(), exported.has(OnnxGraph::Feed));
    prop_assert_eq!(onnx.draft_head(), weights.draft_head.as_ref());
    let got_run = speculative_generate(&mut onnx, prompt, &options).unwrap();
    prop_assert_eq!(&got_run.tokens, &want, "greedy speculative tokens on ORT");
    prop_assert_eq!(got_run.rounds.len(), want_run.rounds.len());
    for (i, (g, w)) in got_run.rounds.iter().zip(&want_run.rounds).enumerate() {
        prop_assert_eq!(
            (g.start, g.proposals, &g.drafted, g.accepted, g.base_token),
            (w.start, w.proposals, &w.drafted, w.accepted, w.base_token),
            "round {}",
            i
        );
        prop_assert_eq!(g.scores.len(), w.scores.len());
        for (a, b) in g.scores.iter().zip(&w.scores) {
            prop_assert!((a - b).abs() <= LOGITS_TOL, "round {i}: score {a} vs {b}");
        }
    }
    let (lower, upper) = onnx.kv().unwrap();
    let len = reference.cache().len();
    prop_assert_eq!(lower.len(), len);
    prop_assert_eq!(upper.len(), len);
    let diff = kv_diff(&lower, reference.cache(), len).max(kv_diff(&upper, reference.cache(), len));
    report(
        "KV after speculative decoding (draft + verifier)",
        diff,
        KV_TOL,
    );
    prop_assert!(
        diff <= KV_TOL,
        "KV after speculative decoding differs by {diff}"
    );
    Ok(())
}

/// A bridge at both sites on the built-in tiny model (the property test draws one half the time):
/// draft.onnx reads the states the reference's draft reads, round by round; an export drafting at
/// another gate than the bridge's leaves it out, as the reference does.
#[test]
fn bridged_drafts_decode_like_the_reference() {
    let base = reference::io::builtin::builtin("tiny").unwrap();
    // (the bridge's gate, the export's draft gate): drafting at another gate ignores the bridge,
    // and its graphs take no bridge input
    for (bridge_gate, draft_gate) in [(1, 1), (2, 2), (1, 2)] {
        let config = reference::m2r2::bridge::BridgeConfig::new(
            bridge_gate,
            4,
            reference::m2r2::bridge::BridgeSite::ALL.to_vec(),
        );
        let weights = M2r2Weights::builtin_for("tiny", &base.config)
            .unwrap()
            .with_bridge(&base.config, config, 3, 0.5)
            .unwrap();
        for static_cache in [None, Some(24)] {
            let dir = tempfile::tempdir().unwrap();
            let exported = export_graphs(
                &base,
                &weights,
                draft_gate,
                dir.path(),
                &GraphKind::ALL,
                static_cache,
            );
            for draft in [DraftLength::Fixed(3), DraftLength::Fixed(1)] {
                check_decoding(
                    &base,
                    &weights,
                    &exported,
                    &EpConfig::cpu(),
                    &[5, 9, 14, 3],
                    12,
                    &draft,
                )
                .unwrap_or_else(|e| {
                    let case = format!("bridge at {bridge_gate}, draft gate {draft_gate}");
                    panic!("{case}, static cache {static_cache:?}: {e}")
                });
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn ort_cpu_decodes_like_the_reference(problem in problem_strategy()) {
        let ep = EpConfig { host_kv: problem.host_kv, ..EpConfig::cpu() };
        problem.check(&ep)?;
    }
}

/// A GPU provider config with TensorRT's profiles for these small problems.
fn gpu(ep: Ep) -> EpConfig {
    EpConfig {
        tensorrt: TensorRtOptions {
            ranges: Some(DimRanges::from_model(5, 64)),
            cache_dir: Some(std::env::temp_dir().join("m2r2-trt-cache")),
            fp16: false,
        },
        ..EpConfig::new(ep)
    }
}

fn gpu_cases(ep: Ep) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(6));
    runner
        .run(&problem_strategy(), |p| p.check(&gpu(ep)))
        .unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU and ORT_DYLIB_PATH at an onnxruntime-gpu library (docs/EQUIVALENCE.md)"]
fn ort_cuda_decodes_like_the_reference() {
    gpu_cases(Ep::Cuda);
}

#[test]
#[ignore = "needs an NVIDIA GPU with TensorRT 10 and ORT_DYLIB_PATH at an onnxruntime-gpu library (docs/EQUIVALENCE.md)"]
fn ort_tensorrt_decodes_like_the_reference() {
    gpu_cases(Ep::TensorRt);
}

/// SmolLM2-135M-Instruct (`m2r2 fetch smollm2`) with its shipped trained weights (adapters, ARLA,
/// pruned draft head, bridge; `reference::m2r2::shipped`), exported dynamic and static: greedy
/// and speculative (fixed and ARLA-dynamic drafts) on two prompts.
#[test]
fn smollm2_on_ort_cpu_decodes_like_the_reference() {
    let loaded =
        reference::io::load::load_model("smollm2").expect("run `m2r2 fetch smollm2` first");
    let base = &loaded.model;
    let weights = M2r2Weights::builtin_for("smollm2", &base.config).unwrap();
    assert!(
        weights.draft_head.is_some(),
        "the shipped weights carry a pruned draft head"
    );
    let draft_gate = weights.config.draft_gate;
    let dir = tempfile::tempdir().unwrap();
    let exported = export_all(base, &weights, draft_gate, dir.path());
    let static_dir = tempfile::tempdir().unwrap();
    let static_export = export_graphs(
        base,
        &weights,
        draft_gate,
        static_dir.path(),
        &GraphKind::ALL,
        Some(64),
    );
    let tokenizer = loaded.tokenizer().unwrap();
    let drafts = [
        DraftLength::Fixed(3),
        DraftLength::Dynamic {
            max: 3,
            gate: GateKind::Arla,
            threshold: 0.5,
        },
    ];
    for (text, draft) in ["The capital of France is", "def fibonacci(n):"]
        .iter()
        .zip(&drafts)
    {
        let prompt = tokenizer.encode(text, true).unwrap();
        for (export, kind) in [(&exported, "dynamic"), (&static_export, "static")] {
            check_decoding(base, &weights, export, &EpConfig::cpu(), &prompt, 8, draft)
                .unwrap_or_else(|e| panic!("{text:?} on the {kind} export: {e}"));
        }
    }
}
